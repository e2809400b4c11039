/*
 * amoeba_check_args.c - `amoeba-check-args KEY=VALUE...`: exit 0 when the plugin
 * would accept these plugstack.conf arguments, else print why and exit 1.
 * `make install ARGS=...` runs it before writing plugstack.conf.d/amoeba.conf.
 */
#include <stdio.h>

#include "amoeba_parse.h"

int main(int argc, char **argv)
{
	struct amoeba_config cfg;
	char err[512];

	if (amoeba_config_parse(&cfg, argc - 1, argv + 1, err, sizeof(err)) < 0) {
		fprintf(stderr, "amoeba: %s\n", err);
		return 1;
	}
	printf("amoeba: enabled=%d max_workers=%u default_partition=%s "
	       "sbatch_support=%d\n", cfg.enabled ? 1 : 0, cfg.max_workers,
	       cfg.default_partition, cfg.sbatch_support ? 1 : 0);
	return 0;
}
