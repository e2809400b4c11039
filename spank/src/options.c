/*
 * options.c - the one option table of the amoeba plugin, its callback, and
 * the per-process state (site settings, the job's request).
 *
 * The table is registered from slurm_spank_init (not exported as
 * spank_options) so that the site can switch the options off:
 * enabled=0 everywhere, sbatch_support=0 in sbatch/salloc.
 */
#include <stdio.h>

#include "amoeba_plugin.h"

struct amoeba_config amoeba_cfg = {
	.enabled = AMOEBA_DEFAULT_ENABLED,
	.max_workers = AMOEBA_DEFAULT_MAX_WORKERS,
	.default_partition = AMOEBA_DEFAULT_PARTITION,
	.sbatch_support = AMOEBA_DEFAULT_SBATCH_SUPPORT,
};
struct amoeba_request amoeba_req;
bool amoeba_inside_allocation;

/*
 * Slurm may call this more than once with the same value (sbatch reads the
 * command line twice); amoeba_request_apply is idempotent, and --no-elastic
 * wins over --elastic in whatever order they come.
 */
static int amoeba_option_cb(int val, const char *optarg, int remote)
{
	char err[AMOEBA_ERR_MAX];
	bool in_job = remote != 0 || amoeba_inside_allocation;

	if (amoeba_request_apply(&amoeba_req, &amoeba_cfg, val, optarg, in_job,
				 err, sizeof(err)) < 0) {
		slurm_error("amoeba: %s", err);
		return -1;
	}
	return 0;
}

static struct spank_option amoeba_options[] = {
	{ "elastic", "MIN[:MAX]",
	  "[amoeba] Run as an elastic job of MIN to MAX workers "
	  "(MIN alone: a fixed size, MAX=MIN).",
	  1, AMOEBA_OPT_ELASTIC, amoeba_option_cb },
	{ "elastic-partition", "NAME",
	  "[amoeba] Partition for the extra workers of an elastic job "
	  "(default: the site's).",
	  1, AMOEBA_OPT_PARTITION, amoeba_option_cb },
	{ "no-elastic", NULL,
	  "[amoeba] Run as an ordinary job even where --elastic is given "
	  "(e.g. by #SBATCH); clear AMOEBA_ELASTIC_*.",
	  0, AMOEBA_OPT_NO_ELASTIC, amoeba_option_cb },
	{ "share", "MODE",
	  "[amoeba] Let the daemon share this elastic job's GPUs with another "
	  "opted-in job (MODE guaranteed, the default, or opportunistic: its "
	  "extra workers may also run beside another job).",
	  2, AMOEBA_OPT_SHARE, amoeba_option_cb },
	SPANK_OPTIONS_TABLE_END
};

int amoeba_load_config(int ac, char **av)
{
	char err[AMOEBA_ERR_MAX];

	/* amoeba_req is not reset here: Slurm's documentation allows remote
	 * option callbacks to run before slurm_spank_init. */
	if (amoeba_config_parse(&amoeba_cfg, ac, av, err, sizeof(err)) < 0) {
		slurm_error("amoeba: %s", err);
		return -1;
	}
	return 0;
}

int amoeba_register_options(spank_t sp)
{
	for (struct spank_option *opt = amoeba_options; opt->name; opt++) {
		spank_err_t rc = spank_option_register(sp, opt);

		if (rc != ESPANK_SUCCESS) {
			slurm_error("amoeba: cannot register --%s: %s",
				    opt->name, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

int amoeba_finish_request(struct amoeba_env *env, bool *has_env)
{
	char err[AMOEBA_ERR_MAX];

	if (amoeba_request_finish(&amoeba_req, &amoeba_cfg, env, has_env, err,
				  sizeof(err)) < 0) {
		slurm_error("amoeba: %s", err);
		return -1;
	}
	return 0;
}

/*
 * Slurm 22.05 runs no option callback in the batch step's slurmstepd, but it
 * leaves every option the job was submitted with in the job's environment as
 * SLURM_SPANK__SLURM_SPANK_OPTION_<plugin>_<option, '-' as '_'> (that is how
 * an srun inside the job inherits them). Read them from there, with the same
 * callback as everywhere else.
 */
int amoeba_options_from_job_env(spank_t sp)
{
	for (struct spank_option *opt = amoeba_options; opt->name; opt++) {
		char name[128], value[256];
		spank_err_t rc;
		int n = snprintf(name, sizeof(name),
				 "SLURM_SPANK__SLURM_SPANK_OPTION_amoeba_%s",
				 opt->name);

		if (n < 0 || (size_t) n >= sizeof(name))
			return -1;
		for (char *c = name; *c; c++)
			if (*c == '-')
				*c = '_';
		rc = spank_getenv(sp, name, value, sizeof(value));
		if (rc == ESPANK_ENV_NOEXIST)
			continue;
		if (rc != ESPANK_SUCCESS) {
			slurm_error("amoeba: cannot read --%s from the job's "
				    "environment (%s): %s", opt->name, name,
				    spank_strerror(rc));
			return -1;
		}
		if (amoeba_option_cb(opt->val, opt->has_arg ? value : NULL,
				     1) < 0)
			return -1;
	}
	return 0;
}
