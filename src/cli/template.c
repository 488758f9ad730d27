/* PLACEHOLDER until the template work lands. */
#include "cli/cli.h"
int ag_cli_template(int argc, char **argv) { return ag_cli_fail("template: not built yet"); }
