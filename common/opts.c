#include "common/opts.h"

#include "common/error.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_program = "dfm";

void dfm_opts_set_program(const char *name) { g_program = name; }

static int opt_count(const dfm_opt *o) {
    int n = 0;
    while (o[n].name) n++;
    return n;
}

/* An integer with an optional k/M/G suffix (--block 64k); 0 when the whole text is one. */
static int parse_int(const char *val, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(val, &end, 0);
    if (end && *end && !errno) {
        long long mul = (*end == 'k' || *end == 'K') ? 1000LL : (*end == 'M') ? 1000000LL : (*end == 'G') ? 1000000000LL : 0;
        if (mul && end[1] == 0) { v *= mul; end++; }
    }
    if (errno || !end || *end || end == val) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *val, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || !end || *end || end == val) return -1;
    *out = v;
    return 0;
}

/* What the table allows for o, for messages and --help ("1 to 64", "at least 1", "one of cpu|cuda"); ""
 * when it declares nothing. */
static const char *limits_text(const dfm_opt *o, char *buf, size_t n) {
    if (o->choices) snprintf(buf, n, "one of %s", o->choices);
    else if (o->min && o->max) snprintf(buf, n, "%s to %s", o->min, o->max);
    else if (o->min) snprintf(buf, n, "at least %s", o->min);
    else if (o->max) snprintf(buf, n, "at most %s", o->max);
    else buf[0] = 0;
    return buf;
}

/* The table's limits fit the option's type and parse. */
static int check_table(const dfm_opt *o) {
    int numeric = o->type == DFM_OPT_INT || o->type == DFM_OPT_DOUBLE;
    long long i;
    double d;
    if ((o->min || o->max) && !numeric)
        return DFM_FAIL(DFM_EINTERNAL, "option table: --%s has min/max but is not a number", o->name);
    if (o->choices && o->type != DFM_OPT_STR)
        return DFM_FAIL(DFM_EINTERNAL, "option table: --%s has choices but is not a string", o->name);
    const char *b[2] = {o->min, o->max};
    for (int k = 0; k < 2; k++)
        if (b[k] && (o->type == DFM_OPT_INT ? parse_int(b[k], &i) : parse_double(b[k], &d)))
            return DFM_FAIL(DFM_EINTERNAL, "option table: --%s has a bound '%s' that does not parse", o->name, b[k]);
    return DFM_OK;
}

static int is_choice(const char *choices, const char *val) {
    size_t n = strlen(val);
    for (const char *c = choices; c; c = strchr(c, '|'), c = c ? c + 1 : NULL)
        if (!strncmp(c, val, n) && (c[n] == '|' || c[n] == 0)) return 1;
    return 0;
}

/* The value o now holds (set from text val) against the table's limits (check_table has passed). */
static int check_limits(const dfm_opt *o, const char *val, const char *origin) {
    int ok = 1;
    if (o->type == DFM_OPT_STR && o->choices) ok = is_choice(o->choices, val);
    if (o->type == DFM_OPT_INT) {
        long long v = *(int64_t *)o->dest, b;
        if (o->min && !parse_int(o->min, &b) && v < b) ok = 0;
        if (o->max && !parse_int(o->max, &b) && v > b) ok = 0;
    }
    if (o->type == DFM_OPT_DOUBLE) {
        double v = *(double *)o->dest, b;
        if (o->min && !parse_double(o->min, &b) && !(v >= b)) ok = 0;
        if (o->max && !parse_double(o->max, &b) && !(v <= b)) ok = 0;
    }
    if (ok) return DFM_OK;
    char lim[160];
    return DFM_FAIL(DFM_EARG, "--%s %s (%s): allowed %s", o->name, val, origin, limits_text(o, lim, sizeof lim));
}

static int set_from_text(dfm_opt *o, const char *val, const char *origin) {
    switch (o->type) {
    case DFM_OPT_STR: {
        char **d = o->dest;
        free(*d);
        *d = strdup(val);
        if (!*d) return DFM_FAIL(DFM_ENOMEM, "no memory");
        return check_limits(o, val, origin);
    }
    case DFM_OPT_INT: {
        long long v;
        if (parse_int(val, &v))
            return DFM_FAIL(DFM_EARG, "--%s expects an integer, got '%s' (%s)", o->name, val, origin);
        *(int64_t *)o->dest = v;
        return check_limits(o, val, origin);
    }
    case DFM_OPT_DOUBLE: {
        double v;
        if (parse_double(val, &v))
            return DFM_FAIL(DFM_EARG, "--%s expects a number, got '%s' (%s)", o->name, val, origin);
        *(double *)o->dest = v;
        return check_limits(o, val, origin);
    }
    case DFM_OPT_FLAG:
        if (!strcmp(val, "1") || !strcmp(val, "true")) *(int *)o->dest = 1;
        else if (!strcmp(val, "0") || !strcmp(val, "false")) *(int *)o->dest = 0;
        else return DFM_FAIL(DFM_EARG, "--%s is a flag; '%s' must be true or false (%s)", o->name, val, origin);
        return DFM_OK;
    }
    return DFM_FAIL(DFM_EINTERNAL, "bad option type");
}

static int set_from_json(dfm_opt *o, json_t *v, const char *file) {
    char buf[64];
    if (json_is_string(v)) return set_from_text(o, json_string_value(v), file);
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return set_from_text(o, buf, file);
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
        return set_from_text(o, buf, file);
    }
    if (json_is_boolean(v)) return set_from_text(o, json_is_true(v) ? "true" : "false", file);
    return DFM_FAIL(DFM_EARG, "config file %s: value of \"%s\" must be a string, number or boolean", file, o->name);
}

static dfm_opt *find_opt(dfm_opt *opts, const char *name) {
    for (dfm_opt *o = opts; o->name; o++)
        if (!strcmp(o->name, name)) return o;
    return NULL;
}

static int load_config(const char *prog, dfm_opt *opts, const char *file) {
    json_error_t jerr;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return DFM_FAIL(DFM_EARG, "config file %s, line %d: %s", file, jerr.line, jerr.text);
    int rc = DFM_OK;
    if (!json_is_object(root)) {
        rc = DFM_FAIL(DFM_EARG, "config file %s must hold a JSON object", file);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        dfm_opt *o = find_opt(opts, key);
        if (o && !json_is_object(val) && (rc = set_from_json(o, val, file))) goto out;
    }
    json_t *sec = json_object_get(root, prog);
    if (sec) {
        if (!json_is_object(sec)) {
            rc = DFM_FAIL(DFM_EARG, "config file %s: \"%s\" must be an object of flags", file, prog);
            goto out;
        }
        json_object_foreach(sec, key, val) {
            dfm_opt *o = find_opt(opts, key);
            if (!o) {
                rc = DFM_FAIL(DFM_EARG, "config file %s: \"%s\" has no option \"%s\". HINT: see '%s %s --help'",
                              file, prog, key, g_program, prog);
                goto out;
            }
            if ((rc = set_from_json(o, val, file))) goto out;
        }
    }
out:
    json_decref(root);
    return rc;
}

static void print_help(const char *prog, const char *usage, const char *summary, const dfm_opt *opts) {
    printf("usage: %s %s %s\n\n%s\n\noptions:\n", g_program, prog, usage ? usage : "[options]", summary ? summary : "");
    for (const dfm_opt *o = opts; o->name; o++) {
        char left[96];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->type == DFM_OPT_FLAG ? "" : " ",
                 o->type == DFM_OPT_FLAG ? "" : (o->metavar ? o->metavar : "X"));
        char lim[160];
        limits_text(o, lim, sizeof lim);
        printf("  %-28s %s", left, o->help ? o->help : "");
        if (o->def && o->type != DFM_OPT_FLAG) printf(" (default: %s%s%s)", o->def, lim[0] ? "; " : "", lim);
        else if (lim[0]) printf(" (%s)", lim);
        printf("\n");
    }
    printf("  %-28s %s\n  %-28s %s\n", "--config FILE", "JSON file of options (flags on the command line win)",
           "--help", "this text");
}

static json_t *effective_config(const dfm_opt *opts) {
    json_t *o = json_object();
    for (const dfm_opt *p = opts; p->name; p++) {
        if (p->no_manifest) continue;
        switch (p->type) {
        case DFM_OPT_STR:
            if (*(char **)p->dest) json_object_set_new(o, p->name, json_string(*(char **)p->dest));
            break;
        case DFM_OPT_INT: json_object_set_new(o, p->name, json_integer(*(int64_t *)p->dest)); break;
        case DFM_OPT_DOUBLE: json_object_set_new(o, p->name, json_real(*(double *)p->dest)); break;
        case DFM_OPT_FLAG: json_object_set_new(o, p->name, json_boolean(*(int *)p->dest)); break;
        }
    }
    return o;
}

static int parse(const char *prog, const char *usage, const char *summary, dfm_opt *opts, int argc, char **argv,
                 char ***pos, int *npos, json_t **effective) {
    int n = opt_count(opts), rc = DFM_OK;
    if (pos) *pos = NULL;
    if (npos) *npos = 0;
    if (effective) *effective = NULL;
    /* defaults */
    for (int i = 0; i < n; i++) {
        dfm_opt *o = &opts[i];
        if (o->type == DFM_OPT_STR) *(char **)o->dest = NULL;
        else if (o->type == DFM_OPT_INT) *(int64_t *)o->dest = 0;
        else if (o->type == DFM_OPT_DOUBLE) *(double *)o->dest = 0;
        else *(int *)o->dest = 0;
        if ((rc = check_table(o))) return rc;
        if (o->def && (rc = set_from_text(o, o->def, "default"))) return rc;
    }
    /* first pass: --help and --config */
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help(prog, usage, summary, opts);
            return DFM_OPTS_HELP;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return DFM_FAIL(DFM_EARG, "--config needs a FILE");
            config = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            config = argv[i] + 9;
        }
    }
    if (config && (rc = load_config(prog, opts, config))) return rc;

    struct option *lo = calloc((size_t)n + 2, sizeof *lo);
    if (!lo) return DFM_FAIL(DFM_ENOMEM, "no memory");
    for (int i = 0; i < n; i++) {
        lo[i].name = opts[i].name;
        lo[i].has_arg = opts[i].type == DFM_OPT_FLAG ? no_argument : required_argument;
        lo[i].val = 1000 + i;
    }
    lo[n].name = "config";
    lo[n].has_arg = required_argument;
    lo[n].val = 999;
    optind = 0; /* glibc: 0 re-initialises getopt fully, so several stages can parse in one process */
    opterr = 0;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        if (c == 999) continue;
        if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1];
            rc = DFM_FAIL(DFM_EARG, "%s %s: unknown option or missing value: '%s'. HINT: see '%s %s --help'", g_program,
                          prog, bad ? bad : "?", g_program, prog);
            break;
        }
        dfm_opt *o = &opts[c - 1000];
        if (o->type == DFM_OPT_FLAG) *(int *)o->dest = 1;
        else if ((rc = set_from_text(o, optarg, "command line"))) break;
    }
    free(lo);
    if (rc) return rc;
    if (!(pos && npos) && optind < argc) /* a flags-only command: a stray word is a mistake, not ignored */
        return DFM_FAIL(DFM_EARG, "%s %s: unexpected argument '%s': this command takes flags only. HINT: a value "
                        "with spaces needs quotes; see '%s %s --help'", g_program, prog, argv[optind], g_program, prog);
    if (pos && npos) {
        int k = argc - optind;
        *pos = calloc((size_t)k + 1, sizeof(char *));
        if (!*pos) return DFM_FAIL(DFM_ENOMEM, "no memory");
        for (int i = 0; i < k; i++) (*pos)[i] = argv[optind + i];
        *npos = k;
    }
    if (effective) *effective = effective_config(opts);
    return DFM_OK;
}

void dfm_opts_free(dfm_opt *opts) {
    for (dfm_opt *o = opts; o->name; o++)
        if (o->type == DFM_OPT_STR) {
            free(*(char **)o->dest);
            *(char **)o->dest = NULL;
        }
}

int dfm_opts_parse(const char *prog, const char *usage, const char *summary, dfm_opt *opts, int argc,
                   char **argv, char ***pos, int *npos, json_t **effective) {
    int rc = parse(prog, usage, summary, opts, argc, argv, pos, npos, effective);
    if (rc != DFM_OK) { /* nothing to free for the caller on failure or --help */
        dfm_opts_free(opts);
        if (pos && *pos) {
            free(*pos);
            *pos = NULL;
        }
    }
    return rc;
}
