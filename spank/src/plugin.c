/*
 * plugin.c - the SPANK entry points of the amoeba plugin.
 *
 * Each hook only dispatches on spank_context() to the file of that context
 * (see amoeba_plugin.h); contexts a hook does not concern return 0.
 */
#include "amoeba_plugin.h"

SPANK_PLUGIN(amoeba, 1);

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_ALLOCATOR:
		return amoeba_allocator_init(sp, ac, av);
	case S_CTX_LOCAL:
		return amoeba_local_init(sp, ac, av);
	case S_CTX_REMOTE:
		return amoeba_remote_init(sp, ac, av);
	default:
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	switch (spank_context()) {
	case S_CTX_ALLOCATOR:
		return amoeba_allocator_init_post_opt(sp);
	case S_CTX_LOCAL:
		return amoeba_local_init_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		return amoeba_remote_user_init(sp);
	default:
		return 0;
	}
}
