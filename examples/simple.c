/* The smallest augur program: load a model, render a chat, stream a greedy
 * reply. Usage: simple MODEL.gguf "question" [max_tokens]
 * Build: cc -Iinclude examples/simple.c -Lbuild -laugur (see the Makefile). */
#include <augur.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_piece(const char *piece, size_t len, void *user) {
    (void)user;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop the generation */
}

int main(int argc, char **argv) {
    if (argc < 3) return fprintf(stderr, "usage: %s MODEL.gguf PROMPT [MAX_TOKENS]\n", argv[0]), 2;
    augur_model *model;
    char        *prompt;
    if (augur_model_load(argv[1], NULL, &model)) return fprintf(stderr, "%s\n", augur_last_error()), 1;
    augur_message chat[] = {{"user", argv[2]}};
    augur_gen_params gp = augur_gen_default_params();
    gp.temperature = 0; /* greedy: always the most likely token */
    gp.max_tokens = argc > 3 ? atoi(argv[3]) : 128;
    gp.prompt_kind = AUGUR_PROMPT_CHAT;
    augur_usage usage;
    augur_status st = augur_chat_render(model, chat, 1, true, &prompt, NULL);
    if (!st) st = augur_generate(model, prompt, strlen(prompt), &gp, print_piece, NULL, &usage);
    if (st) fprintf(stderr, "%s: %s\n", augur_status_name(st), augur_last_error());
    else fprintf(stderr, "\n%d prompt tokens, %d generated\n", usage.prompt_tokens, usage.generated_tokens);
    augur_free(prompt);
    augur_model_free(model);
    return st ? 1 : 0;
}
