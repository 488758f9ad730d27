/* PLACEHOLDER until the tokenizer work lands. */
#include "cli/cli.h"
int ag_cli_tokenize(int argc, char **argv) { return ag_cli_fail("tokenize: not built yet"); }
int ag_cli_detokenize(int argc, char **argv) { return ag_cli_fail("detokenize: not built yet"); }
