/*
 * test_parse.c - unit tests of the pure parsers in src/amoeba_parse.c:
 * option values, plugstack arguments, the request and its environment.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "amoeba_parse.h"
#include "check.h"

static char err[512];

static void test_range_accepts_min_and_min_max(void)
{
	static const struct {
		const char *text;
		unsigned site_max, min, max;
	} cases[] = {
		{ "2:4", 1024, 2, 4 },
		{ "1", 1024, 1, 1 },     /* MIN alone: a fixed size */
		{ "8", 8, 8, 8 },
		{ "3:3", 1024, 3, 3 },
		{ "1:8", 8, 1, 8 },      /* MAX equal to the site limit */
		{ "02:08", 1024, 2, 8 }, /* leading zeros are still decimal */
		{ "1:1000000", 0, 1, 1000000 }, /* no site limit: hard cap */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct amoeba_range r = { 0, 0 };
		int rc = amoeba_parse_range(cases[i].text, cases[i].site_max,
					    &r, err, sizeof(err));

		CHECK(rc == 0);
		CHECK(r.min == cases[i].min);
		CHECK(r.max == cases[i].max);
		if (rc)
			fprintf(stderr, "  %s: %s\n", cases[i].text, err);
	}
}

static void test_range_rejects_with_flag_and_value(void)
{
	static const struct {
		const char *text;
		unsigned site_max;
		const char *needle; /* besides the flag and value */
	} cases[] = {
		{ "5:2", 1024, "MIN (5) is above MAX (2); write --elastic=2:5" },
		{ "5:2", 4, "MIN (5) is above MAX (2); write --elastic=2:5" },
		{ "5000:2", 8, "MIN (5000) is above MAX (2)" },
		{ "99999999999:2", 8, "more than 8 workers" },
		{ "0", 1024, "at least 1" },
		{ "0:4", 1024, "at least 1" },
		{ "abc", 1024, "expected MIN[:MAX]" },
		{ "2:", 1024, "expected MIN[:MAX]" },
		{ ":4", 1024, "expected MIN[:MAX]" },
		{ "2:4:6", 1024, "expected MIN[:MAX]" },
		{ "-1", 1024, "expected MIN[:MAX]" },
		{ "+2", 1024, "expected MIN[:MAX]" },
		{ " 2", 1024, "expected MIN[:MAX]" },
		{ "2 ", 1024, "expected MIN[:MAX]" },
		{ "2.5", 1024, "expected MIN[:MAX]" },
		{ "0x10", 1024, "expected MIN[:MAX]" },
		{ "2:9", 8, "more than 8 workers, this site's limit" },
		{ "9", 8, "more than 8 workers" },
		{ "99999999999999999999999", 8, "more than 8 workers" },
		{ "1:1000001", 0, "more than 1000000 workers" },
		{ "4294967297:1", 0, "more than 1000000 workers" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct amoeba_range r = { 7, 7 };
		char want[128];

		err[0] = '\0';
		CHECK(amoeba_parse_range(cases[i].text, cases[i].site_max, &r,
					 err, sizeof(err)) == -1);
		CHECK(r.min == 7 && r.max == 7);
		snprintf(want, sizeof(want), "--elastic=%s:", cases[i].text);
		CHECK_HAS(err, want);
		CHECK_HAS(err, cases[i].needle);
	}
}

static void test_range_rejects_missing_value(void)
{
	struct amoeba_range r;

	CHECK(amoeba_parse_range(NULL, 8, &r, err, sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic needs a value MIN[:MAX]");
	CHECK(amoeba_parse_range("", 8, &r, err, sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic needs a value");
}

static void test_messages_quote_unprintable_and_long_values(void)
{
	struct amoeba_range r;
	char q[16];
	char long_value[300];

	CHECK(amoeba_parse_range("2\n:\x1b[31m", 8, &r, err, sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic=2?:?[31m:");
	CHECK(strchr(err, '\n') == NULL);

	memset(long_value, '7', sizeof(long_value) - 1);
	long_value[sizeof(long_value) - 1] = '\0';
	CHECK(amoeba_parse_range(long_value, 8, &r, err, sizeof(err)) == -1);
	CHECK_HAS(err, "...: asks for more than 8 workers");

	CHECK_STR(amoeba_quote("abc", q, sizeof(q)), "abc");
	CHECK_STR(amoeba_quote(NULL, q, sizeof(q)), "(null)");
	CHECK_STR(amoeba_quote("0123456789abcdefXYZ", q, sizeof(q)),
		  "0123456789ab...");
	CHECK_STR(amoeba_quote("\xc3\xa9t\xc3\xa9", q, sizeof(q)), "??t??");
	CHECK_STR(amoeba_quote("abc", q, 2), "a");
}

static void test_error_buffer_is_never_overrun(void)
{
	struct amoeba_range r;
	char small[8];

	memset(small, 'x', sizeof(small));
	CHECK(amoeba_parse_range("5:2", 8, &r, small, 4) == -1);
	CHECK_STR(small, "--e");
	CHECK(small[4] == 'x');
	CHECK(amoeba_parse_range("5:2", 8, &r, NULL, 0) == -1);
}

static void test_partition_names(void)
{
	char out[AMOEBA_PARTITION_MAX + 1];
	char too_long[AMOEBA_PARTITION_MAX + 2];

	CHECK(amoeba_parse_partition("elastic", "--elastic-partition", out,
				     err, sizeof(err)) == 0);
	CHECK_STR(out, "elastic");
	CHECK(amoeba_parse_partition("gpu_A-100.x", "--elastic-partition", out,
				     err, sizeof(err)) == 0);
	CHECK_STR(out, "gpu_A-100.x");

	CHECK(amoeba_parse_partition("", "--elastic-partition", out, err,
				     sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic-partition needs a partition NAME");
	CHECK(amoeba_parse_partition("a b", "--elastic-partition", out, err,
				     sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic-partition=a b: a partition name holds only");
	CHECK(amoeba_parse_partition("x;rm", "--elastic-partition", out, err,
				     sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic-partition=x;rm:");

	memset(too_long, 'p', sizeof(too_long) - 1);
	too_long[sizeof(too_long) - 1] = '\0';
	CHECK(amoeba_parse_partition(too_long, "--elastic-partition", out, err,
				     sizeof(err)) == -1);
	CHECK_HAS(err, "at most 63 characters");
	too_long[AMOEBA_PARTITION_MAX] = '\0';
	CHECK(amoeba_parse_partition(too_long, "--elastic-partition", out, err,
				     sizeof(err)) == 0);
	CHECK(strlen(out) == AMOEBA_PARTITION_MAX);
}

static int parse_args(struct amoeba_config *cfg, const char *a,
		      const char *b)
{
	char *av[2];
	int ac = 0;

	if (a)
		av[ac++] = (char *) a;
	if (b)
		av[ac++] = (char *) b;
	return amoeba_config_parse(cfg, ac, av, err, sizeof(err));
}

static void test_config_defaults(void)
{
	struct amoeba_config cfg;

	CHECK(parse_args(&cfg, NULL, NULL) == 0);
	CHECK(cfg.enabled == true);
	CHECK(cfg.max_workers == 1024);
	CHECK_STR(cfg.default_partition, "elastic");
	CHECK(cfg.sbatch_support == true);
}

static void test_config_accepts_every_key(void)
{
	struct amoeba_config cfg;
	char *av[] = { "enabled=0", "max_workers=16",
		       "default_partition=spot", "sbatch_support=0" };

	CHECK(amoeba_config_parse(&cfg, 4, av, err, sizeof(err)) == 0);
	CHECK(cfg.enabled == false);
	CHECK(cfg.max_workers == 16);
	CHECK_STR(cfg.default_partition, "spot");
	CHECK(cfg.sbatch_support == false);

	CHECK(parse_args(&cfg, "enabled=1", "max_workers=1000000") == 0);
	CHECK(cfg.enabled == true);
	CHECK(cfg.max_workers == 1000000);
}

static void test_config_rejects_bad_arguments(void)
{
	static const struct {
		const char *arg;
		const char *needle;
	} cases[] = {
		{ "max_worker=4", "max_worker=4 is not one of: enabled=0|1 "
				  "(default 1), max_workers=N (default 1024), "
				  "default_partition=NAME (default elastic), "
				  "sbatch_support=0|1 (default 1)" },
		{ "enabled", "enabled is not one of" },
		{ "=1", "=1 is not one of" },
		{ "Enabled=1", "Enabled=1 is not one of" },
		{ "enabledx=1", "enabledx=1 is not one of" },
		{ "enabled=yes", "enabled=yes: enabled takes 0 or 1" },
		{ "enabled=", "enabled=: enabled takes 0 or 1" },
		{ "enabled=10", "enabled takes 0 or 1" },
		{ "sbatch_support=2", "sbatch_support takes 0 or 1" },
		{ "max_workers=0", "max_workers=0: max_workers takes a whole "
				   "number from 1 to 1000000" },
		{ "max_workers=-4", "max_workers takes a whole number" },
		{ "max_workers=4x", "max_workers takes a whole number" },
		{ "max_workers=", "max_workers takes a whole number" },
		{ "max_workers=1000001", "max_workers takes a whole number" },
		{ "default_partition=", "default_partition needs a partition NAME" },
		{ "default_partition=a/b", "default_partition=a/b: a partition "
					   "name holds only" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct amoeba_config cfg;

		amoeba_config_defaults(&cfg);
		cfg.max_workers = 77;
		err[0] = '\0';
		CHECK(parse_args(&cfg, cases[i].arg, NULL) == -1);
		CHECK(cfg.max_workers == 77); /* untouched on failure */
		CHECK_HAS(err, "plugstack.conf argument");
		CHECK_HAS(err, cases[i].needle);
	}
}

static void test_config_rejects_repeated_key(void)
{
	struct amoeba_config cfg;

	CHECK(parse_args(&cfg, "max_workers=4", "max_workers=8") == -1);
	CHECK_HAS(err, "max_workers=8: max_workers is given twice");
}

static struct amoeba_config site(unsigned max_workers)
{
	struct amoeba_config cfg;

	amoeba_config_defaults(&cfg);
	cfg.max_workers = max_workers;
	return cfg;
}

static void test_request_exports_range_and_default_partition(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "2:4", false,
				   err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK(has_env && env.set);
	CHECK_STR(env.vars[0].name, "AMOEBA_ELASTIC_MIN");
	CHECK_STR(env.vars[0].value, "2");
	CHECK_STR(env.vars[1].name, "AMOEBA_ELASTIC_MAX");
	CHECK_STR(env.vars[1].value, "4");
	CHECK_STR(env.vars[2].name, "AMOEBA_ELASTIC_PARTITION");
	CHECK_STR(env.vars[2].value, "elastic");
	CHECK_STR(env.vars[3].name, "AMOEBA_DAEMON_UID");
	CHECK_STR(env.vars[3].value, ""); /* the site named no daemon uid */
}

static void test_config_daemon_uid_reaches_the_job(void)
{
	struct amoeba_config cfg;
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env;
	static const char *const bad[] = { "daemon_uid=", "daemon_uid=-1",
					   "daemon_uid=4294967295",
					   "daemon_uid=99999999999",
					   "daemon_uid=99x", "daemon_uid=amoeba" };

	CHECK(parse_args(&cfg, "daemon_uid=990", NULL) == 0);
	CHECK(cfg.daemon_uid == 990);
	CHECK(parse_args(&cfg, "daemon_uid=0", NULL) == 0);
	CHECK(cfg.daemon_uid == 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct amoeba_config other;

		CHECK(parse_args(&other, bad[i], NULL) < 0);
		CHECK_HAS(err, "daemon_uid takes the numeric uid amoebad "
			       "runs as");
	}
	CHECK(parse_args(&cfg, "daemon_uid=990", NULL) == 0);
	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "1:2", false,
				   err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[3].name, "AMOEBA_DAEMON_UID");
	CHECK_STR(env.vars[3].value, "990");
}

static void test_request_share_exports_its_mode_and_needs_elastic(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "1:2", false,
				   err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[4].name, "AMOEBA_SHARE");
	CHECK_STR(env.vars[4].value, ""); /* not opted in */
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_SHARE, NULL, false,
				   err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[4].value, "guaranteed"); /* --share alone */
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_SHARE,
				   "opportunistic", false, err,
				   sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[4].value, "opportunistic");
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_SHARE, "always",
				   false, err, sizeof(err)) < 0);
	CHECK_HAS(err, "--share=always is not a sharing mode");
	CHECK_STR(req.share, "opportunistic"); /* a failure changes nothing */

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_SHARE, "guaranteed",
				   false, err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) < 0);
	CHECK_HAS(err, "--share=guaranteed needs --elastic=MIN[:MAX]");
}

static void test_request_min_alone_is_fixed_size(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "3", false,
				   err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[0].value, "3");
	CHECK_STR(env.vars[1].value, "3");
}

static void test_request_is_idempotent_and_no_elastic_wins(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request once, twice;

	amoeba_request_reset(&once);
	amoeba_request_reset(&twice);
	CHECK(amoeba_request_apply(&once, &cfg, AMOEBA_OPT_ELASTIC, "2:4",
				   false, err, sizeof(err)) == 0);
	CHECK(amoeba_request_apply(&once, &cfg, AMOEBA_OPT_PARTITION, "spot",
				   false, err, sizeof(err)) == 0);
	for (int i = 0; i < 2; i++) {
		CHECK(amoeba_request_apply(&twice, &cfg, AMOEBA_OPT_ELASTIC,
					   "2:4", false, err, sizeof(err)) == 0);
		CHECK(amoeba_request_apply(&twice, &cfg, AMOEBA_OPT_PARTITION,
					   "spot", false, err, sizeof(err)) == 0);
	}
	CHECK(memcmp(&once, &twice, sizeof(once)) == 0);

	/* #SBATCH --elastic=2:4, then --no-elastic on the command line */
	CHECK(amoeba_request_apply(&twice, &cfg, AMOEBA_OPT_NO_ELASTIC, NULL,
				   false, err, sizeof(err)) == 0);
	CHECK(twice.mode == AMOEBA_MODE_OFF);
	/* --no-elastic, then --elastic: still off (slurmstepd sees no order) */
	CHECK(amoeba_request_apply(&twice, &cfg, AMOEBA_OPT_ELASTIC, "1:2",
				   false, err, sizeof(err)) == 0);
	CHECK(twice.mode == AMOEBA_MODE_OFF);
	/* ... but the value is still checked */
	CHECK(amoeba_request_apply(&twice, &cfg, AMOEBA_OPT_ELASTIC, "2:1",
				   false, err, sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic=2:1: MIN (2) is above MAX (1)");
}

static void test_request_result_does_not_depend_on_option_order(void)
{
	static const int orders[6][3] = {
		{ 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 },
		{ 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 },
	};
	static const int options[3] = {
		AMOEBA_OPT_ELASTIC, AMOEBA_OPT_PARTITION, AMOEBA_OPT_NO_ELASTIC
	};
	static const char *values[3] = { "2:4", "spot", NULL };
	struct amoeba_config cfg = site(8);

	for (int with_off = 0; with_off < 2; with_off++) {
		for (int o = 0; o < 6; o++) {
			struct amoeba_request req;
			struct amoeba_env env;
			bool has_env;

			amoeba_request_reset(&req);
			for (int k = 0; k < 3; k++) {
				int i = orders[o][k];

				if (i == 2 && !with_off)
					continue;
				CHECK(amoeba_request_apply(&req, &cfg,
							   options[i],
							   values[i], false,
							   err, sizeof(err)) == 0);
			}
			CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env,
						    err, sizeof(err)) == 0);
			CHECK(has_env);
			CHECK(env.set == !with_off);
			if (!with_off)
				CHECK_STR(env.vars[1].value, "4");
		}
	}
}

static void test_request_failure_leaves_request_unchanged(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req, before;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "2:4", false,
				   err, sizeof(err)) == 0);
	before = req;
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "5:2", false,
				   err, sizeof(err)) == -1);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_PARTITION, "a b",
				   false, err, sizeof(err)) == -1);
	CHECK(amoeba_request_apply(&req, &cfg, 99, "x", false, err,
				   sizeof(err)) == -1);
	CHECK_HAS(err, "unknown option number 99");
	CHECK(memcmp(&req, &before, sizeof(req)) == 0);
}

static void test_request_in_job_skips_only_the_site_limit(void)
{
	struct amoeba_config cfg = site(4);
	struct amoeba_request req;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "2:16",
				   false, err, sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic=2:16: asks for more than 4 workers");
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "2:16", true,
				   err, sizeof(err)) == 0);
	CHECK(req.range.max == 16);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "0", true,
				   err, sizeof(err)) == -1);
}

static void test_request_partition_needs_elastic(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env = true;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_PARTITION, "spot",
				   false, err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == -1);
	CHECK_HAS(err, "--elastic-partition=spot needs --elastic=MIN[:MAX]");

	/* --no-elastic overrides a partition from the script quietly */
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_NO_ELASTIC, NULL,
				   false, err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK(has_env && !env.set);
}

static void test_request_without_options_exports_nothing(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env = true;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK(!has_env);
}

static void test_request_partition_option_beats_site_default(void)
{
	struct amoeba_config cfg = site(8);
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env;

	amoeba_request_reset(&req);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_PARTITION, "spot",
				   false, err, sizeof(err)) == 0);
	CHECK(amoeba_request_apply(&req, &cfg, AMOEBA_OPT_ELASTIC, "1:2", false,
				   err, sizeof(err)) == 0);
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[2].value, "spot");
	/* finishing twice gives the same environment */
	CHECK(amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				    sizeof(err)) == 0);
	CHECK_STR(env.vars[2].value, "spot");
	CHECK_STR(env.vars[1].value, "2");
}

int main(void)
{
	test_range_accepts_min_and_min_max();
	test_range_rejects_with_flag_and_value();
	test_range_rejects_missing_value();
	test_messages_quote_unprintable_and_long_values();
	test_error_buffer_is_never_overrun();
	test_partition_names();
	test_config_defaults();
	test_config_accepts_every_key();
	test_config_rejects_bad_arguments();
	test_config_rejects_repeated_key();
	test_request_exports_range_and_default_partition();
	test_request_min_alone_is_fixed_size();
	test_config_daemon_uid_reaches_the_job();
	test_request_is_idempotent_and_no_elastic_wins();
	test_request_result_does_not_depend_on_option_order();
	test_request_failure_leaves_request_unchanged();
	test_request_in_job_skips_only_the_site_limit();
	test_request_partition_needs_elastic();
	test_request_without_options_exports_nothing();
	test_request_partition_option_beats_site_default();
	test_request_share_exports_its_mode_and_needs_elastic();
	return CHECK_DONE("test_parse");
}
