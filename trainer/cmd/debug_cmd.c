/* debug_cmd.c — `dfm-train debug-state`: the reference dump of trainer/model/debug_state.h. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/opts.h"
#include "trainer/cmd/commands.h"
#include "trainer/model/debug_state.h"

int cmd_debug_state(int argc, char **argv) {
    char *out = NULL, *variant = NULL;
    int64_t seed = 0;
    dfm_opt opts[] = {
        {"out", DFM_OPT_STR, &out, NULL, "FILE", "safetensors file to write", 1},
        {"variant", DFM_OPT_STR, &variant, "dfm-head", "NAME", "tiny model: DFM with a gate per head or per channel, or a pretraining model", 0, .choices = "dfm-head|dfm-channel|pretrain"},
        {"seed", DFM_OPT_INT, &seed, "1", "N", "random seed of the tiny model and its inputs", 0},
        {0},
    };
    int rc = dfm_opts_parse("debug-state", "--out FILE [--variant NAME]",
                            "Builds a tiny random model, runs one training step's forward and backward and writes "
                            "parameters, inputs, loss, gradients and activations for tests/py/train/test_train_torch_parity.py.",
                            opts, argc, argv, NULL, NULL, NULL);
    if (rc == DFM_OPTS_HELP) { dfm_opts_free(opts); return 0; }
    if (!rc && !out) rc = DFM_FAIL(DFM_EARG, "--out is required");
    if (!rc) rc = debug_state_write(out, variant, (uint64_t)seed);
    dfm_opts_free(opts);
    return rc;
}
