/* opts.h — command-line flags plus an optional JSON config file, one table per subcommand.
 *
 * Each subcommand declares a table of dfm_opt; dfm_opts_parse() fills the destinations from, in
 * increasing priority: the defaults, the config file (--config FILE), and the command line
 * (getopt_long). --help prints a usage generated from the table. The effective configuration comes
 * back as a JSON object for the run's manifest.
 *
 * Config file: a JSON object. Keys equal to a flag's long name set it ("seq-len": 2048). A key equal
 * to the subcommand's name holds an object of that subcommand's flags ({"chunk": {"seq-len": 2048}}),
 * which wins over top-level keys; unknown keys inside that section are an error (a typo must not be
 * silently ignored), unknown top-level keys are left for other subcommands.
 */
#ifndef DFM_OPTS_H
#define DFM_OPTS_H

#include <jansson.h>
#include <stdint.h>

typedef enum {
    DFM_OPT_STR,    /* dest: char ** (strdup'd; free with dfm_opts_free) */
    DFM_OPT_INT,    /* dest: int64_t * */
    DFM_OPT_DOUBLE, /* dest: double * */
    DFM_OPT_FLAG,   /* dest: int *; present = 1; in a config file: true/false */
} dfm_opt_type;

typedef struct {
    const char *name;    /* long name, without "--" */
    dfm_opt_type type;
    void *dest;
    const char *def;     /* default as text; NULL = unset (STR stays NULL, numbers 0) */
    const char *metavar; /* e.g. "N", "FILE" */
    const char *help;
    int no_manifest;     /* 1: keep out of the manifest's config (paths of no consequence, verbosity) */
    /* Declared limits, checked on every value the option takes (default, config file, command line) and
     * shown by --help; give them by name after the fields above: {..., 0, .min = "1", .max = "64"}. */
    const char *min, *max; /* INT, DOUBLE: inclusive bounds, as text in the flag's own syntax ("1", "4G",
                            * "0.5"); NULL = unbounded on that side */
    const char *choices;   /* STR: the allowed values separated by '|' ("cpu|cuda"); NULL = any */
} dfm_opt;

/* A positive return: --help was printed; the caller exits 0. */
#define DFM_OPTS_HELP 1

/* Parse. prog is the subcommand name ("chunk"), usage the text after "dfm chunk" in the usage line,
 * summary one paragraph. Positional arguments are returned in *pos (pointers into argv; *npos of
 * them; free *pos with free()); pos and npos NULL declare a flags-only command, which refuses any
 * positional argument (DFM_EARG naming it) rather than ignoring it. *effective (may be NULL) receives a new JSON object of every option
 * that is set. Returns DFM_OK, DFM_OPTS_HELP or DFM_EARG (message names the flag, the value, where it
 * came from and what is allowed); DFM_EINTERNAL for a table whose limits do not fit an option's type
 * or do not parse. On any return but DFM_OK nothing is left allocated. */
int dfm_opts_parse(const char *prog, const char *usage, const char *summary, dfm_opt *opts, int argc,
                   char **argv, char ***pos, int *npos, json_t **effective);

/* The program name used in usage lines and hints (default "dfm"; dfm-train sets its own). */
void dfm_opts_set_program(const char *name);

/* Free the strings that parsing allocated (safe to call twice). */
void dfm_opts_free(dfm_opt *opts);

#endif
