/* PLACEHOLDER until the gguf work lands: replaced by the real `augur info`. */
#include "cli/cli.h"
int ag_cli_info(int argc, char **argv) { return ag_cli_fail("info: not built yet"); }
