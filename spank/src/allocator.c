/*
 * allocator.c - sbatch and salloc (S_CTX_ALLOCATOR).
 *
 * The options exist here unless the site says sbatch_support=0. Values are
 * checked, site limit included, as Slurm reads them (command line and
 * #SBATCH lines), so a bad one stops the submission; then AMOEBA_ELASTIC_*
 * go into the environment the job is submitted with.
 */
#include "amoeba_plugin.h"

int amoeba_allocator_init(spank_t sp, int ac, char **av)
{
	if (amoeba_load_config(ac, av) < 0)
		return -1;
	if (!amoeba_cfg.enabled || !amoeba_cfg.sbatch_support)
		return 0;
	return amoeba_register_options(sp);
}

int amoeba_allocator_init_post_opt(spank_t sp)
{
	(void) sp;
	return amoeba_export_process_env();
}
