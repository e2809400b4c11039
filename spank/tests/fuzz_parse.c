/*
 * fuzz_parse.c - feed the parsers arbitrary strings, built under ASan+UBSan.
 *
 *   fuzz_parse [ITERATIONS] [SEED]     SEED 0 (default): pick one and print it
 *
 * Every input lives in a heap block of exactly its size, and every error
 * buffer too, so a read or write past either end stops the run. Besides not
 * crashing, results are checked against a second, independent reading of
 * MIN[:MAX] (strtoul on a regex-like scan) and against the invariants the
 * plugin relies on: 1 <= MIN <= MAX <= limit; a failure leaves the output
 * untouched and writes a terminated message naming the flag.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amoeba_parse.h"

static uint64_t rng_state;
static long failures;
static long accepted_ranges;

static uint64_t next(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static unsigned below(unsigned n)
{
	return n ? (unsigned) (next() % n) : 0;
}

#define FAIL(...)                                                            \
	do {                                                                 \
		failures++;                                                  \
		fprintf(stderr, "fuzz_parse: " __VA_ARGS__);                 \
		fputc('\n', stderr);                                         \
	} while (0)

/* A random string in a block of exactly its size; callers free it. */
static char *random_text(void)
{
	static const char alphabet[] = "0123456789:::0123456789-+ x=._,\n";
	static const char *pieces[] = {
		"enabled=", "max_workers=", "default_partition=",
		"sbatch_support=", "0", "1", ":", "4294967296", "999999",
		"1000000", "1000001", "elastic", "=", "\xff", "%s%n",
	};
	size_t len = 0, cap = 1 + below(96);
	char *buf = malloc(cap + 16);

	if (!buf)
		abort();
	if (below(3) == 0) {
		/* near-valid MIN[:MAX], sometimes with one byte changed */
		len = (size_t) snprintf(buf, cap + 16, "%u", below(below(2) ? 20 : 3000));
		if (below(4))
			len += (size_t) snprintf(buf + len, cap + 16 - len, ":%u",
						 below(below(2) ? 20 : 3000));
		if (len && below(6) == 0)
			buf[below((unsigned) len)] = (char) below(256);
		cap = 0;
	}
	while (len < cap) {
		unsigned pick = below(10);

		if (pick < 5) {
			buf[len++] = alphabet[below(sizeof(alphabet) - 1)];
		} else if (pick < 7) {
			buf[len++] = (char) (1 + below(255));
		} else {
			const char *p = pieces[below(sizeof(pieces) /
						     sizeof(pieces[0]))];
			size_t n = strlen(p);

			if (len + n > cap)
				break;
			memcpy(buf + len, p, n);
			len += n;
		}
	}
	if (below(8) == 0)
		len = 0;
	{
		char *exact = malloc(len + 1);

		if (!exact)
			abort();
		memcpy(exact, buf, len);
		exact[len] = '\0';
		free(buf);
		return exact;
	}
}

/* The oracle: MIN[:MAX] with at most 9 digits each, read with strtoul. */
static bool oracle_range(const char *text, unsigned limit, unsigned *min,
			 unsigned *max, bool *decided)
{
	const char *colon = strchr(text, ':');
	size_t n1 = colon ? (size_t) (colon - text) : strlen(text);
	const char *second = colon ? colon + 1 : NULL;
	size_t n2 = second ? strlen(second) : 0;

	*decided = true;
	if (n1 == 0 || strspn(text, "0123456789") != n1)
		return false;
	if (second && (n2 == 0 || strspn(second, "0123456789") != n2))
		return false;
	if (n1 > 9 || n2 > 9) {
		*decided = false; /* too big for the oracle: must be an error */
		return false;
	}
	*min = (unsigned) strtoul(text, NULL, 10);
	*max = second ? (unsigned) strtoul(second, NULL, 10) : *min;
	return *min >= 1 && *min <= *max && *max <= limit;
}

static char *error_buffer(size_t *len)
{
	/* mostly roomy, sometimes tiny, sometimes absent */
	unsigned pick = below(10);
	char *err;

	*len = pick == 0 ? 0 : pick < 3 ? 1 + below(12) : 512;
	if (*len == 0)
		return NULL;
	err = malloc(*len);
	if (!err)
		abort();
	memset(err, 'Z', *len);
	return err;
}

static bool terminated(const char *err, size_t len)
{
	return !err || memchr(err, '\0', len) != NULL;
}

static void fuzz_range(const char *text)
{
	unsigned site = below(3) ? 1 + below(2000) : 0;
	unsigned limit = site ? site : AMOEBA_WORKERS_HARD_MAX;
	struct amoeba_range r = { 12345, 54321 };
	unsigned omin = 0, omax = 0;
	bool decided;
	size_t errlen;
	char *err = error_buffer(&errlen);
	int rc = amoeba_parse_range(text, site, &r, err, errlen);
	bool want = oracle_range(text, limit, &omin, &omax, &decided);

	if (rc == 0) {
		accepted_ranges++;
		if (r.min < 1 || r.min > r.max || r.max > limit)
			FAIL("range '%s' site %u gave %u:%u", text, site,
			     r.min, r.max);
		if (!decided || !want || r.min != omin || r.max != omax)
			FAIL("range '%s' site %u: plugin %u:%u, oracle %s %u:%u",
			     text, site, r.min, r.max,
			     want ? "accepts" : "rejects", omin, omax);
	} else {
		if (rc != -1 || r.min != 12345 || r.max != 54321)
			FAIL("range '%s': rc %d or output changed", text, rc);
		if (decided && want)
			FAIL("range '%s' site %u rejected, oracle accepts %u:%u",
			     text, site, omin, omax);
		if (!terminated(err, errlen))
			FAIL("range '%s': message not terminated", text);
		if (err && errlen >= 512 && !strstr(err, "--elastic"))
			FAIL("range '%s': message '%s' names no flag", text,
			     err);
	}
	free(err);
}

static void fuzz_partition(const char *text)
{
	char out[AMOEBA_PARTITION_MAX + 1] = "untouched";
	size_t errlen;
	char *err = error_buffer(&errlen);
	size_t len = strlen(text);
	bool want = len >= 1 && len <= AMOEBA_PARTITION_MAX &&
		strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
		       "0123456789._-") == len;
	int rc = amoeba_parse_partition(text, "--elastic-partition", out, err,
					errlen);

	if ((rc == 0) != want)
		FAIL("partition '%s': rc %d, want %s", text, rc,
		     want ? "accept" : "reject");
	if (rc == 0 && strcmp(out, text) != 0)
		FAIL("partition '%s' copied as '%s'", text, out);
	if (rc != 0 && strcmp(out, "untouched") != 0)
		FAIL("partition '%s': output changed on failure", text);
	if (rc != 0 && !terminated(err, errlen))
		FAIL("partition '%s': message not terminated", text);
	free(err);
}

static void fuzz_config(void)
{
	int ac = (int) below(6);
	char *av[6];
	struct amoeba_config cfg;
	size_t errlen;
	char *err = error_buffer(&errlen);
	int rc;

	for (int i = 0; i < ac; i++)
		av[i] = random_text();
	memset(&cfg, 0xA5, sizeof(cfg));
	rc = amoeba_config_parse(&cfg, ac, av, err, errlen);
	if (rc == 0) {
		size_t plen = strnlen(cfg.default_partition,
				      sizeof(cfg.default_partition));

		if (cfg.max_workers < 1 ||
		    cfg.max_workers > AMOEBA_WORKERS_HARD_MAX ||
		    plen == 0 || plen > AMOEBA_PARTITION_MAX)
			FAIL("config accepted into an invalid state");
	} else {
		if (rc != -1)
			FAIL("config rc %d", rc);
		if (!terminated(err, errlen))
			FAIL("config message not terminated");
	}
	for (int i = 0; i < ac; i++)
		free(av[i]);
	free(err);
}

static void fuzz_request(void)
{
	struct amoeba_config cfg;
	struct amoeba_request req;
	struct amoeba_env env;
	bool has_env;
	char err[512];
	int steps = (int) below(6);

	amoeba_config_defaults(&cfg);
	cfg.max_workers = 1 + below(64);
	amoeba_request_reset(&req);
	for (int i = 0; i < steps; i++) {
		char *text = below(2) ? random_text() : NULL;
		int option = (int) below(5);

		(void) amoeba_request_apply(&req, &cfg, option, text,
					    below(2) != 0, err, sizeof(err));
		free(text);
	}
	if (amoeba_request_finish(&req, &cfg, &env, &has_env, err,
				  sizeof(err)) == 0 && has_env && env.set) {
		unsigned long mn = strtoul(env.vars[0].value, NULL, 10);
		unsigned long mx = strtoul(env.vars[1].value, NULL, 10);

		if (mn < 1 || mn > mx || !env.vars[2].value[0])
			FAIL("request exported %s:%s in '%s'",
			     env.vars[0].value, env.vars[1].value,
			     env.vars[2].value);
	}
}

int main(int argc, char **argv)
{
	long iterations = argc > 1 ? atol(argv[1]) : 200000;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;

	if (seed == 0)
		seed = (uint64_t) time(NULL) ^ ((uint64_t) clock() << 32);
	if (seed == 0)
		seed = 1;
	rng_state = seed;
	for (long i = 0; i < iterations; i++) {
		char *text = random_text();

		fuzz_range(text);
		fuzz_partition(text);
		if (i % 4 == 0)
			fuzz_config();
		if (i % 4 == 1)
			fuzz_request();
		free(text);
		if (failures > 20)
			break;
	}
	fprintf(stderr, "fuzz_parse: %ld iterations (%ld valid ranges), seed %llu, "
		"%ld failures\n", iterations, accepted_ranges,
		(unsigned long long) seed, failures);
	return failures ? 1 : 0;
}
