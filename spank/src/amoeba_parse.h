/*
 * amoeba_parse.h - the pure part of the amoeba SPANK plugin.
 *
 * Everything here is plain C with no Slurm dependency, so the unit and fuzz
 * tests in spank/tests link it without a Slurm process around them:
 *
 *   - the plugstack.conf arguments (enabled=, max_workers=, default_partition=,
 *     sbatch_support=), parsed through one table of keys;
 *   - the option values (--elastic=MIN[:MAX], --elastic-partition=NAME);
 *   - the request a job makes through its options, and the environment
 *     (AMOEBA_ELASTIC_*) it turns into.
 *
 * Functions that can fail return 0 on success and -1 on failure; on failure
 * they write a one-line message into err (never more than errlen bytes,
 * always terminated) that names the flag or key and the offending value.
 */
#ifndef AMOEBA_PARSE_H
#define AMOEBA_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "amoeba_env.h"

/* Longest partition name accepted (Slurm itself has no small limit). */
#define AMOEBA_PARTITION_MAX 63
/* No site may allow more workers than this (keeps every count in 32 bits). */
#define AMOEBA_WORKERS_HARD_MAX 1000000u
/* Room for a value quoted into an error message, see amoeba_quote(). */
#define AMOEBA_QUOTE_MAX 72

/* The site's settings: the arguments after the plugin path in plugstack.conf. */
struct amoeba_config {
	bool enabled;          /* enabled=0|1: 0 registers no option at all */
	unsigned max_workers;  /* max_workers=N: the largest MAX a job may ask for */
	char default_partition[AMOEBA_PARTITION_MAX + 1]; /* default_partition=NAME */
	bool sbatch_support;   /* sbatch_support=0|1: 0 hides the options from sbatch/salloc */
	long long daemon_uid;  /* daemon_uid=N: amoebad's uid, exported to elastic jobs as
				  AMOEBA_DAEMON_UID (their agents trust only it); -1: none */
};

/* Defaults, also written in docs/spank.md. */
#define AMOEBA_DEFAULT_ENABLED true
#define AMOEBA_DEFAULT_MAX_WORKERS 1024u
#define AMOEBA_DEFAULT_PARTITION "elastic"
#define AMOEBA_DEFAULT_SBATCH_SUPPORT true
#define AMOEBA_DEFAULT_DAEMON_UID (-1LL)
/* The largest uid daemon_uid= takes ((uid_t) -1 is no uid). */
#define AMOEBA_DAEMON_UID_MAX 4294967294UL

/* A worker range; MIN alone means MAX = MIN (a fixed-size job). */
struct amoeba_range {
	unsigned min;
	unsigned max;
};

/* The options, told apart by the spank_option val field. */
enum amoeba_option {
	AMOEBA_OPT_ELASTIC = 1,    /* --elastic=MIN[:MAX] */
	AMOEBA_OPT_PARTITION = 2,  /* --elastic-partition=NAME */
	AMOEBA_OPT_NO_ELASTIC = 3, /* --no-elastic */
	AMOEBA_OPT_SHARE = 4,      /* --share[=guaranteed|opportunistic] */
};

/* Longest sharing mode ("opportunistic"), and the mode --share alone means. */
#define AMOEBA_SHARE_MAX 15
#define AMOEBA_SHARE_DEFAULT "guaranteed"

/*
 * What the job's options ask for. --no-elastic wins over --elastic in any
 * order: slurmstepd gets the options as a set, so "the last one wins" could
 * not mean the same there as in sbatch.
 */
enum amoeba_mode {
	AMOEBA_MODE_UNSET = 0, /* neither option: the plugin leaves the job alone */
	AMOEBA_MODE_ELASTIC,   /* --elastic=MIN[:MAX] */
	AMOEBA_MODE_OFF,       /* --no-elastic (with or without --elastic):
				  clear AMOEBA_ELASTIC_* */
};

struct amoeba_request {
	enum amoeba_mode mode;
	struct amoeba_range range;                /* valid in AMOEBA_MODE_ELASTIC */
	char partition[AMOEBA_PARTITION_MAX + 1]; /* "" until set */
	char share[AMOEBA_SHARE_MAX + 1];         /* sharing mode; "" until set */
};

/*
 * The job environment a request turns into: AMOEBA_ENV_ELASTIC_MIN, _MAX,
 * _PARTITION, AMOEBA_ENV_DAEMON_UID and AMOEBA_ENV_SHARE of amoeba_env.h, in
 * that order (the daemon's uid is empty, which the job reads as unset, when the
 * site gave none; the sharing mode is empty when the job did not opt in).
 */
#define AMOEBA_REQUEST_VARS 5

struct amoeba_env_var {
	const char *name;
	char value[AMOEBA_PARTITION_MAX + 1];
};

struct amoeba_env {
	bool set;   /* true: set every var; false: unset every var (clear) */
	struct amoeba_env_var vars[AMOEBA_REQUEST_VARS];
};

/*
 * Copy text into buf for an error message: at most buflen - 1 bytes, bytes
 * that are not printable ASCII replaced by '?', "..." appended when cut
 * short, "(null)" for NULL. Returns buf.
 */
const char *amoeba_quote(const char *text, char *buf, size_t buflen);

/* Fill cfg with the defaults above. */
void amoeba_config_defaults(struct amoeba_config *cfg);

/*
 * Parse the plugstack.conf arguments av[0..ac-1] ("key=value" each) into
 * cfg, starting from the defaults. Unknown keys, repeated keys, missing '='
 * and bad values are errors; the message lists every valid key with its
 * default.
 */
int amoeba_config_parse(struct amoeba_config *cfg, int ac, char *const av[],
			char *err, size_t errlen);

/*
 * Parse "MIN" or "MIN:MAX" (decimal digits only) for the flag --elastic.
 * Requires 1 <= MIN <= MAX; when site_max > 0 also MAX <= site_max,
 * otherwise MAX <= AMOEBA_WORKERS_HARD_MAX.
 */
int amoeba_parse_range(const char *text, unsigned site_max,
		       struct amoeba_range *out, char *err, size_t errlen);

/*
 * Check a partition name (1..AMOEBA_PARTITION_MAX characters out of
 * [A-Za-z0-9._-]) and copy it into out (AMOEBA_PARTITION_MAX + 1 bytes).
 * what names the flag or key in the message, e.g. "--elastic-partition".
 */
int amoeba_parse_partition(const char *text, const char *what, char *out,
			   char *err, size_t errlen);

/*
 * Check a sharing mode for --share ("guaranteed" or "opportunistic"; NULL or
 * "" is --share alone: AMOEBA_SHARE_DEFAULT) and copy it into out
 * (AMOEBA_SHARE_MAX + 1 bytes).
 */
int amoeba_parse_share(const char *text, char *out, char *err, size_t errlen);

/* Forget every option: the state before any callback ran. */
void amoeba_request_reset(struct amoeba_request *req);

/*
 * Apply one option to req, as a spank option callback does. Idempotent:
 * applying the same option with the same value twice leaves req as once.
 * in_job is true where the job exists already (slurmstepd, an srun inside
 * an allocation): the site limit was checked when it was submitted, so only
 * the syntax is checked again. On failure req is left unchanged.
 */
int amoeba_request_apply(struct amoeba_request *req,
			 const struct amoeba_config *cfg, int option,
			 const char *optarg, bool in_job, char *err,
			 size_t errlen);

/*
 * After every option was seen: reject --elastic-partition or --share without
 * --elastic,
 * fill the partition from the site default, and describe the environment the
 * job gets. Returns 0 with *has_env false when the job asked for nothing.
 */
int amoeba_request_finish(struct amoeba_request *req,
			  const struct amoeba_config *cfg,
			  struct amoeba_env *env, bool *has_env, char *err,
			  size_t errlen);

#endif /* AMOEBA_PARSE_H */
