/* build_cmd.c — `dfm build CONFIG [--run DIR] [--stages LIST] [--force]`: flags, then dfm_build_run
 * (build.h, which describes the config). */
#include "common/error.h"
#include "common/mpiutil.h"
#include "common/opts.h"
#include "pipeline/driver/build.h"

#include <stdlib.h>

int dfm_cmd_build(int argc, char **argv) {
    char *run = NULL, *stages = NULL;
    int force = 0, check = 0;
    dfm_opt table[] = {
        {"run", DFM_OPT_STR, &run, NULL, "DIR", "run directory (default: \"run\" in CONFIG)", 1},
        {"stages", DFM_OPT_STR, &stages, NULL, "LIST", "comma-separated stages to run (default: all: chunk,encode,index,retrieve,write-targets)", 1},
        {"force", DFM_OPT_FLAG, &force, NULL, NULL, "pass --force to every stage", 1},
        {"check", DFM_OPT_FLAG, &check, NULL, NULL, "run nothing: exit 0 if the stages (--stages, or all) are complete in the run's manifest, else say which is not (no MPI, no lock)", 1},
        {0},
    };
    char **pos = NULL;
    int npos = 0;
    int rc = dfm_opts_parse("build", "CONFIG",
                            "Run the pipeline stages on one run directory from one JSON config, skipping what is complete "
                            "and resuming what was interrupted; print a summary table.",
                            table, argc, argv, &pos, &npos, NULL);
    if (rc == DFM_OPTS_HELP) {
        return 0;
    }
    if (!rc && npos != 1) rc = DFM_FAIL(DFM_EARG, "usage: dfm build CONFIG [--run DIR] [--stages LIST] [--force | --check]");
    if (!rc && check && force) rc = DFM_FAIL(DFM_EARG, "--check runs nothing: drop --force");
    dfm_build_config bc = {rc ? NULL : pos[0], run, stages, force, check};
    if (!rc && check) rc = dfm_build_check(&bc);
    else if (!rc) {
        dfm_mpi m;
        rc = dfm_mpi_init(&argc, &argv, &m);
        if (!rc) rc = dfm_build_run(&m, &bc);
    }
    free(pos);
    dfm_opts_free(table);
    return rc;
}
