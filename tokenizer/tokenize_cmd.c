/* tokenize_cmd.c — `dfm tokenize`: encode text to ids, or decode ids to text, with a tokenizer.json. */
#include "common/error.h"
#include "common/log.h"
#include "common/opts.h"
#include "tokenizer/tokenizer.h"

#include <ctype.h>
#include <jansson.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (;;) {
        if (n + 4096 > cap) {
            char *q = realloc(b, cap *= 2);
            if (!q) { free(b); return DFM_FAIL(DFM_ENOMEM, "no memory for %zu bytes of input", cap); }
            b = q;
        }
        size_t r = fread(b + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) break;
    }
    if (ferror(stdin)) { free(b); return DFM_FAIL(DFM_EIO, "reading standard input: %s", strerror(errno)); }
    b[n] = 0;
    *out = b;
    *len = n;
    return DFM_OK;
}

static int parse_ids(const char *s, dfm_ids *ids) {
    const char *p = s;
    while (*p) {
        while (*p && (isspace((unsigned char)*p) || *p == ',' || *p == '[' || *p == ']')) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || v > UINT32_MAX || *p == '-')
            return DFM_FAIL(DFM_EARG, "--decode expects token ids (non-negative integers separated by spaces or commas), "
                            "got '%.20s'", p);
        DFM_TRY(dfm_ids_push(ids, (uint32_t)v));
        p = end;
    }
    return DFM_OK;
}

int dfm_cmd_tokenize(int argc, char **argv) {
    char *tok_path = NULL;
    int decode = 0, skip_special = 0, describe = 0, jsonl = 0;
    dfm_opt opts[] = {
        {"tokenizer", DFM_OPT_STR, &tok_path, NULL, "FILE", "tokenizer.json (or its folder); default $DFM_TOKENIZER", 1},
        {"decode", DFM_OPT_FLAG, &decode, NULL, NULL, "read token ids and print the text they decode to", 0},
        {"skip-special", DFM_OPT_FLAG, &skip_special, NULL, NULL, "with --decode: drop special tokens", 0},
        {"describe", DFM_OPT_FLAG, &describe, NULL, NULL, "print the tokenizer's description and sizes to stderr", 1},
        {"jsonl", DFM_OPT_FLAG, &jsonl, NULL, NULL,
         "input is JSON lines (a string, or an object with \"text\"): print one line of ids per input line", 0},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("tokenize", "--tokenizer FILE [--decode | --jsonl] [TEXT|-]",
                            "Encode TEXT (or standard input when TEXT is '-' or absent) with a Hugging Face "
                            "tokenizer.json and print the token ids separated by spaces (add_special_tokens=False: "
                            "no BOS/EOS added; special tokens written in the text are matched). With --decode, TEXT "
                            "holds ids and the decoded text is printed.",
                            opts, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) { dfm_opts_free(opts); free(pos); return 0; }
    dfm_tokenizer *tok = NULL;
    char *input = NULL;
    size_t in_len = 0;
    dfm_ids ids = {0};
    if (rc) goto done;
    if (!tok_path && getenv("DFM_TOKENIZER")) tok_path = strdup(getenv("DFM_TOKENIZER"));
    if (!tok_path) {
        rc = DFM_FAIL(DFM_EARG, "--tokenizer is required. HINT: --tokenizer /var/cache/dfm/tokenizers/qwen2.5/tokenizer.json");
        goto done;
    }
    if (jsonl && decode) {
        rc = DFM_FAIL(DFM_EARG, "--jsonl and --decode cannot be combined. HINT: --decode reads ids separated by spaces");
        goto done;
    }
    if (npos > 1) {
        rc = DFM_FAIL(DFM_EARG, "expected at most one TEXT argument, got %d. HINT: quote the text", npos);
        goto done;
    }
    if ((rc = dfm_tokenizer_load(tok_path, &tok))) goto done;
    if (describe)
        fprintf(stderr, "%s; %u ids; eos %lld; hash %016llx\n", dfm_tokenizer_describe(tok), dfm_tokenizer_vocab_size(tok),
                (long long)dfm_tokenizer_eos_id(tok), (unsigned long long)dfm_tokenizer_hash(tok));
    if (npos == 0 || !strcmp(pos[0], "-")) {
        if ((rc = read_stdin(&input, &in_len))) goto done;
    } else {
        input = strdup(pos[0]);
        in_len = strlen(pos[0]);
        if (!input) { rc = DFM_FAIL(DFM_ENOMEM, "no memory"); goto done; }
    }
    if (jsonl) {
        size_t lineno = 0, rep = 0;
        for (char *line = input, *next; line && !rc; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            lineno++;
            if (!*line) continue; /* blank lines give no output line */
            json_error_t je;
            json_t *j = json_loads(line, JSON_ALLOW_NUL | JSON_DECODE_ANY, &je);
            json_t *t = json_is_object(j) ? json_object_get(j, "text") : j;
            if (!json_is_string(t)) {
                rc = DFM_FAIL(DFM_EFORMAT, "input line %zu: expected a JSON string or an object with a \"text\" string%s%s",
                              lineno, j ? "" : ": ", j ? "" : je.text);
            } else {
                ids.n = 0;
                size_t r = 0;
                rc = dfm_tokenizer_encode(tok, json_string_value(t), json_string_length(t), &ids, &r);
                rep += r;
                for (size_t i = 0; !rc && i < ids.n; i++) printf(i ? " %u" : "%u", ids.ids[i]);
                putchar('\n');
            }
            json_decref(j);
        }
        if (rep) DFM_LOG_W("input held %zu invalid UTF-8 sequence(s); each was replaced by U+FFFD", rep);
    } else if (decode) {
        if ((rc = parse_ids(input, &ids))) goto done;
        char *text = NULL;
        size_t tl = 0;
        if ((rc = dfm_tokenizer_decode(tok, ids.ids, ids.n, skip_special, &text, &tl))) goto done;
        fwrite(text, 1, tl, stdout);
        fputc('\n', stdout);
        free(text);
    } else {
        size_t rep = 0;
        if ((rc = dfm_tokenizer_encode(tok, input, in_len, &ids, &rep))) goto done;
        if (rep) DFM_LOG_W("input held %zu invalid UTF-8 sequence(s); each was replaced by U+FFFD", rep);
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %u" : "%u", ids.ids[i]);
        putchar('\n');
    }
    if (fflush(stdout)) rc = DFM_FAIL(DFM_EIO, "writing standard output: %s", strerror(errno));
done:
    dfm_ids_free(&ids);
    free(input);
    dfm_tokenizer_free(tok);
    dfm_opts_free(opts);
    free(pos);
    return rc;
}
