/*
 * amoeba_plugin.h - what the context files of the amoeba SPANK plugin share.
 *
 * plugin.c holds the slurm_spank_* entry points and dispatches on
 * spank_context() to one file per context:
 *
 *   allocator.c  sbatch, salloc  validate the options, export AMOEBA_ELASTIC_*
 *                                into the environment the job is submitted with
 *   local.c      srun            the same for the environment srun passes on
 *   remote.c     slurmstepd      set AMOEBA_ELASTIC_* in every step's own
 *                                environment (works with --export=NONE too)
 *
 * slurmd and prolog/epilog contexts do nothing. options.c holds the one option
 * table, its callback and the per-process state; amoeba_parse.c the pure
 * parsers behind them.
 */
#ifndef AMOEBA_PLUGIN_H
#define AMOEBA_PLUGIN_H

#include <slurm/spank.h>

#include "amoeba_parse.h"

/* Room for any message the parsers write. */
#define AMOEBA_ERR_MAX 512

/* The site's settings and the job's request, one copy per process. */
extern struct amoeba_config amoeba_cfg;
extern struct amoeba_request amoeba_req;
/* srun inside an existing allocation: the job passed the site limit already. */
extern bool amoeba_inside_allocation;

/* options.c */
int amoeba_load_config(int ac, char **av);
int amoeba_register_options(spank_t sp);
int amoeba_finish_request(struct amoeba_env *env, bool *has_env);
int amoeba_options_from_job_env(spank_t sp);

/* process_env.c: allocator and local contexts */
int amoeba_export_process_env(void);

/* one file per context */
int amoeba_allocator_init(spank_t sp, int ac, char **av);
int amoeba_allocator_init_post_opt(spank_t sp);
int amoeba_local_init(spank_t sp, int ac, char **av);
int amoeba_local_init_post_opt(spank_t sp);
int amoeba_remote_init(spank_t sp, int ac, char **av);
int amoeba_remote_user_init(spank_t sp);

#endif /* AMOEBA_PLUGIN_H */
