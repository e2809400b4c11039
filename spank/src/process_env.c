/*
 * process_env.c - put the job's request into this process's environment.
 *
 * Used where the job starts from the submitting process: sbatch (the
 * environment is copied into the job with the default --export=ALL), salloc
 * (the shell or command it starts inherits it) and srun (passes it to tasks).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "amoeba_plugin.h"

int amoeba_export_process_env(void)
{
	struct amoeba_env env;
	bool has_env;

	if (amoeba_finish_request(&env, &has_env) < 0)
		return -1;
	if (!has_env)
		return 0;
	for (int i = 0; i < AMOEBA_REQUEST_VARS; i++) {
		const struct amoeba_env_var *var = &env.vars[i];
		int rc = env.set ? setenv(var->name, var->value, 1)
				 : unsetenv(var->name);

		if (rc != 0) {
			slurm_error("amoeba: cannot %s %s=%s: %s",
				    env.set ? "set" : "unset", var->name,
				    var->value, strerror(errno));
			return -1;
		}
	}
	if (env.set)
		slurm_verbose("amoeba: elastic job of %s to %s workers, extra "
			      "workers in partition %s", env.vars[0].value,
			      env.vars[1].value, env.vars[2].value);
	else
		slurm_verbose("amoeba: --no-elastic: cleared AMOEBA_ELASTIC_*");
	return 0;
}
