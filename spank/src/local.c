/*
 * local.c - srun (S_CTX_LOCAL).
 *
 * srun may create its own allocation, so it takes the options like sbatch
 * (sbatch_support does not concern it) and passes AMOEBA_ELASTIC_* on to its
 * tasks through its own environment. Inside an allocation (SLURM_JOB_ID set)
 * srun also re-reads the job's own options from the environment; those passed
 * the site limit when the job was submitted, and are not held to it again, so
 * lowering max_workers does not break steps of jobs already running.
 */
#include <stdlib.h>

#include "amoeba_plugin.h"

int amoeba_local_init(spank_t sp, int ac, char **av)
{
	if (amoeba_load_config(ac, av) < 0)
		return -1;
	amoeba_inside_allocation = getenv("SLURM_JOB_ID") != NULL;
	if (!amoeba_cfg.enabled)
		return 0;
	return amoeba_register_options(sp);
}

int amoeba_local_init_post_opt(spank_t sp)
{
	(void) sp;
	return amoeba_export_process_env();
}
