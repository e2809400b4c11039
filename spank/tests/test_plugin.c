/*
 * test_plugin.c - the plugin's SPANK hooks driven through a fake Slurm
 * (fake_spank.c): which options exist in which context under which
 * plugstack arguments, what the callbacks reject, and what environment the
 * submitting process (sbatch/salloc/srun) and the step (slurmstepd) get.
 */
#include <stdlib.h>
#include <string.h>

#include "amoeba_plugin.h"
#include "check.h"
#include "fake_spank.h"

int slurm_spank_init(spank_t sp, int ac, char **av);
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av);
int slurm_spank_user_init(spank_t sp, int ac, char **av);

#define SP ((spank_t) NULL)

static int init(spank_context_t ctx, const char *a, const char *b)
{
	char *av[2];
	int ac = 0;

	fake_reset(ctx);
	/* what a freshly loaded plugin starts from */
	amoeba_request_reset(&amoeba_req);
	amoeba_inside_allocation = false;
	if (a)
		av[ac++] = (char *) a;
	if (b)
		av[ac++] = (char *) b;
	return slurm_spank_init(SP, ac, av);
}

/* Call an option's callback the way Slurm does. */
static int give(const char *name, const char *value, int remote)
{
	struct spank_option *opt = fake_option(name);

	if (!opt)
		return -2;
	return opt->cb(opt->val, value, remote);
}

static void clear_process_env(void)
{
	unsetenv("AMOEBA_ELASTIC_MIN");
	unsetenv("AMOEBA_ELASTIC_MAX");
	unsetenv("AMOEBA_ELASTIC_PARTITION");
}

static void test_sbatch_exports_range_into_submission_env(void)
{
	clear_process_env();
	CHECK(init(S_CTX_ALLOCATOR, "max_workers=8", NULL) == 0);
	CHECK(fake_option_count == 4);
	CHECK(fake_option("elastic") && fake_option("elastic-partition") &&
	      fake_option("no-elastic"));
	CHECK(strncmp(fake_option("elastic")->usage, "[amoeba] ", 9) == 0);
	/* sbatch reads the command line twice: same value, same result */
	CHECK(give("elastic", "2:4", 0) == 0);
	CHECK(give("elastic", "2:4", 0) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK_STR(getenv("AMOEBA_ELASTIC_MIN"), "2");
	CHECK_STR(getenv("AMOEBA_ELASTIC_MAX"), "4");
	CHECK_STR(getenv("AMOEBA_ELASTIC_PARTITION"), "elastic");
}

static void test_sbatch_rejects_bad_values_naming_flag_and_value(void)
{
	static const char *bad[] = { "5:2", "0", "abc", "2:9" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[64];

		CHECK(init(S_CTX_ALLOCATOR, "max_workers=8", NULL) == 0);
		CHECK(give("elastic", bad[i], 0) == -1);
		snprintf(want, sizeof(want), "amoeba: --elastic=%s: ", bad[i]);
		CHECK_HAS(fake_last_error, want);
	}
	CHECK(init(S_CTX_ALLOCATOR, NULL, NULL) == 0);
	CHECK(give("elastic-partition", "no such", 0) == -1);
	CHECK_HAS(fake_last_error, "amoeba: --elastic-partition=no such: ");
}

static void test_sbatch_partition_without_elastic_fails_post_opt(void)
{
	CHECK(init(S_CTX_ALLOCATOR, NULL, NULL) == 0);
	CHECK(give("elastic-partition", "spot", 0) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == -1);
	CHECK_HAS(fake_last_error, "--elastic-partition=spot needs --elastic");
}

static void test_no_elastic_clears_inherited_submission_env(void)
{
	setenv("AMOEBA_ELASTIC_MIN", "1", 1);
	setenv("AMOEBA_ELASTIC_MAX", "3", 1);
	setenv("AMOEBA_ELASTIC_PARTITION", "elastic", 1);
	CHECK(init(S_CTX_ALLOCATOR, NULL, NULL) == 0);
	CHECK(give("elastic", "1:3", 0) == 0);
	CHECK(give("no-elastic", NULL, 0) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK(getenv("AMOEBA_ELASTIC_MIN") == NULL);
	CHECK(getenv("AMOEBA_ELASTIC_MAX") == NULL);
	CHECK(getenv("AMOEBA_ELASTIC_PARTITION") == NULL);
}

static void test_without_options_the_job_is_left_alone(void)
{
	setenv("AMOEBA_ELASTIC_MIN", "1", 1);
	CHECK(init(S_CTX_ALLOCATOR, NULL, NULL) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK_STR(getenv("AMOEBA_ELASTIC_MIN"), "1");
	clear_process_env();
}

static void test_enabled_0_registers_nothing_anywhere(void)
{
	static const spank_context_t contexts[] = {
		S_CTX_ALLOCATOR, S_CTX_LOCAL, S_CTX_REMOTE
	};

	for (size_t i = 0; i < 3; i++) {
		CHECK(init(contexts[i], "enabled=0", NULL) == 0);
		CHECK(fake_option_count == 0);
		CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
		CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	}
}

static void test_sbatch_support_0_hides_options_from_sbatch_only(void)
{
	CHECK(init(S_CTX_ALLOCATOR, "sbatch_support=0", NULL) == 0);
	CHECK(fake_option_count == 0);
	CHECK(init(S_CTX_LOCAL, "sbatch_support=0", NULL) == 0);
	CHECK(fake_option_count == 4);
	CHECK(init(S_CTX_REMOTE, "sbatch_support=0", NULL) == 0);
	CHECK(fake_option_count == 4);
}

static void test_srun_exports_into_its_env(void)
{
	clear_process_env();
	CHECK(init(S_CTX_LOCAL, "default_partition=spot", NULL) == 0);
	CHECK(give("elastic", "3", 0) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK_STR(getenv("AMOEBA_ELASTIC_MIN"), "3");
	CHECK_STR(getenv("AMOEBA_ELASTIC_MAX"), "3");
	CHECK_STR(getenv("AMOEBA_ELASTIC_PARTITION"), "spot");
	clear_process_env();
}

static void test_srun_inside_a_job_is_not_held_to_the_site_limit_again(void)
{
	unsetenv("SLURM_JOB_ID");
	CHECK(init(S_CTX_LOCAL, "max_workers=4", NULL) == 0);
	CHECK(give("elastic", "2:16", 0) == -1);
	CHECK_HAS(fake_last_error, "--elastic=2:16: asks for more than 4");

	setenv("SLURM_JOB_ID", "42", 1);
	CHECK(init(S_CTX_LOCAL, "max_workers=4", NULL) == 0);
	CHECK(give("elastic", "2:16", 0) == 0);
	CHECK(give("elastic", "3:1", 0) == -1); /* the syntax still counts */

	/* sbatch inside a job submits a new job: the limit applies */
	CHECK(init(S_CTX_ALLOCATOR, "max_workers=4", NULL) == 0);
	CHECK(give("elastic", "2:16", 0) == -1);
	unsetenv("SLURM_JOB_ID");
	clear_process_env();
}

static void test_slurmstepd_sets_step_env_without_site_limit(void)
{
	CHECK(init(S_CTX_REMOTE, "max_workers=4", NULL) == 0);
	CHECK(give("elastic", "2:16", 1) == 0);
	CHECK(give("elastic-partition", "spot", 1) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK(fake_step_getenv("AMOEBA_ELASTIC_MIN") == NULL);
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_MIN"), "2");
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_MAX"), "16");
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_PARTITION"), "spot");
	/* hooks called again leave the same environment */
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_MAX"), "16");
}

static void test_slurmstepd_no_elastic_unsets_step_env(void)
{
	CHECK(init(S_CTX_REMOTE, NULL, NULL) == 0);
	fake_step_setenv("AMOEBA_ELASTIC_MIN", "2");
	fake_step_setenv("AMOEBA_ELASTIC_MAX", "4");
	CHECK(give("no-elastic", NULL, 1) == 0);
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK(fake_step_getenv("AMOEBA_ELASTIC_MIN") == NULL);
	CHECK(fake_step_getenv("AMOEBA_ELASTIC_MAX") == NULL);
}

#define OPT_ENV "SLURM_SPANK__SLURM_SPANK_OPTION_amoeba_"

static void test_batch_step_reads_options_from_job_env(void)
{
	/* Slurm runs no callback in the batch step; the options are in the
	 * job's environment as srun would inherit them. */
	CHECK(init(S_CTX_REMOTE, "default_partition=spot", NULL) == 0);
	fake_step_setenv(OPT_ENV "elastic", "2:3");
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_MIN"), "2");
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_MAX"), "3");
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_PARTITION"), "spot");

	CHECK(init(S_CTX_REMOTE, NULL, NULL) == 0);
	fake_step_setenv(OPT_ENV "elastic", "2:3");
	fake_step_setenv(OPT_ENV "elastic_partition", "batch");
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_PARTITION"), "batch");

	CHECK(init(S_CTX_REMOTE, NULL, NULL) == 0);
	fake_step_setenv(OPT_ENV "elastic", "2:3");
	fake_step_setenv(OPT_ENV "no_elastic", "(null)");
	fake_step_setenv("AMOEBA_ELASTIC_MIN", "2");
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK(fake_step_getenv("AMOEBA_ELASTIC_MIN") == NULL);

	CHECK(init(S_CTX_REMOTE, NULL, NULL) == 0);
	fake_step_setenv(OPT_ENV "elastic", "0");
	CHECK(slurm_spank_user_init(SP, 0, NULL) == -1);
	CHECK_HAS(fake_last_error, "amoeba: --elastic=0: MIN must be at least 1");
}

static void test_callbacks_take_precedence_over_job_env(void)
{
	CHECK(init(S_CTX_REMOTE, NULL, NULL) == 0);
	fake_step_setenv(OPT_ENV "elastic", "2:3");
	CHECK(give("elastic", "1:5", 1) == 0);
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK_STR(fake_step_getenv("AMOEBA_ELASTIC_MAX"), "5");
}

static void test_bad_plugstack_args_fail_init_naming_the_argument(void)
{
	CHECK(init(S_CTX_ALLOCATOR, "max_workers=8", "color=blue") == -1);
	CHECK_HAS(fake_last_error, "amoeba: plugstack.conf argument color=blue "
		  "is not one of: enabled=0|1");
	CHECK(fake_option_count == 0);
	CHECK(init(S_CTX_REMOTE, "enabled=2", NULL) == -1);
	CHECK_HAS(fake_last_error, "enabled=2: enabled takes 0 or 1");
}

static void test_slurmd_and_prolog_contexts_do_nothing(void)
{
	CHECK(init(S_CTX_SLURMD, "color=blue", NULL) == 0);
	CHECK(fake_option_count == 0);
	CHECK(init(S_CTX_JOB_SCRIPT, NULL, NULL) == 0);
	CHECK(slurm_spank_init_post_opt(SP, 0, NULL) == 0);
	CHECK(slurm_spank_user_init(SP, 0, NULL) == 0);
	CHECK(fake_option_count == 0);
}

int main(void)
{
	test_sbatch_exports_range_into_submission_env();
	test_sbatch_rejects_bad_values_naming_flag_and_value();
	test_sbatch_partition_without_elastic_fails_post_opt();
	test_no_elastic_clears_inherited_submission_env();
	test_without_options_the_job_is_left_alone();
	test_enabled_0_registers_nothing_anywhere();
	test_sbatch_support_0_hides_options_from_sbatch_only();
	test_srun_exports_into_its_env();
	test_srun_inside_a_job_is_not_held_to_the_site_limit_again();
	test_slurmstepd_sets_step_env_without_site_limit();
	test_slurmstepd_no_elastic_unsets_step_env();
	test_batch_step_reads_options_from_job_env();
	test_callbacks_take_precedence_over_job_env();
	test_bad_plugstack_args_fail_init_naming_the_argument();
	test_slurmd_and_prolog_contexts_do_nothing();
	return CHECK_DONE("test_plugin");
}
