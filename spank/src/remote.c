/*
 * remote.c - slurmstepd (S_CTX_REMOTE), once per step on every node.
 *
 * Slurm hands the job's options to each srun step (callbacks run with
 * remote=1); the batch step gets none and reads them from the job's
 * environment instead (amoeba_options_from_job_env). Either way
 * AMOEBA_ELASTIC_* are written into the step's environment, so the batch
 * script and every task see them even when the job was submitted with
 * --export=NONE. The site limit was enforced at submission and is not checked
 * again: lowering max_workers does not break jobs already queued.
 */
#include "amoeba_plugin.h"

int amoeba_remote_init(spank_t sp, int ac, char **av)
{
	if (amoeba_load_config(ac, av) < 0)
		return -1;
	if (!amoeba_cfg.enabled)
		return 0;
	return amoeba_register_options(sp);
}

int amoeba_remote_user_init(spank_t sp)
{
	struct amoeba_env env;
	bool has_env;

	if (!amoeba_cfg.enabled)
		return 0;
	/* No callback ran: the batch step, or a job without our options. */
	if (amoeba_req.mode == AMOEBA_MODE_UNSET && !amoeba_req.partition[0] &&
	    !amoeba_req.share[0] && amoeba_options_from_job_env(sp) < 0)
		return -1;
	if (amoeba_finish_request(&env, &has_env) < 0)
		return -1;
	if (!has_env)
		return 0;
	for (int i = 0; i < AMOEBA_REQUEST_VARS; i++) {
		const struct amoeba_env_var *var = &env.vars[i];
		spank_err_t rc = env.set
			? spank_setenv(sp, var->name, var->value, 1)
			: spank_unsetenv(sp, var->name);

		if (rc != ESPANK_SUCCESS) {
			slurm_error("amoeba: cannot %s %s=%s in the job: %s",
				    env.set ? "set" : "unset", var->name,
				    var->value, spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}
