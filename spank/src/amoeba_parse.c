/*
 * amoeba_parse.c - plugstack arguments, option values and the job's request.
 *
 * Pure functions only (see amoeba_parse.h): no Slurm calls, no allocation,
 * no global state, so tests and fuzzers can call them on any input.
 */
#include "amoeba_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ELASTIC_FLAG "--elastic"
#define PARTITION_FLAG "--elastic-partition"
#define SHARE_FLAG "--share"

/* Write a formatted message into err (always terminated, cut if too long). */
__attribute__((format(printf, 3, 4)))
static void set_error(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	(void) vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

const char *amoeba_quote(const char *text, char *buf, size_t buflen)
{
	static const char ellipsis[] = "...";
	size_t room, i;

	if (!buf || buflen == 0)
		return "";
	if (!text) {
		(void) snprintf(buf, buflen, "%s", "(null)");
		return buf;
	}
	room = buflen - 1;
	for (i = 0; text[i] && i < room; i++) {
		unsigned char c = (unsigned char) text[i];

		buf[i] = (c >= 0x20 && c < 0x7f) ? (char) c : '?';
	}
	buf[i] = '\0';
	if (text[i] && room >= sizeof(ellipsis) - 1)
		memcpy(buf + room - (sizeof(ellipsis) - 1), ellipsis,
		       sizeof(ellipsis));
	return buf;
}

/*
 * Read a run of decimal digits at *p into *out, saturating at
 * AMOEBA_WORKERS_HARD_MAX + 1 so that no input overflows. Returns -1 when
 * *p does not start with a digit.
 */
static int scan_count(const char **p, unsigned long *out)
{
	const char *s = *p;
	unsigned long v = 0;

	if (*s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++) {
		v = v * 10 + (unsigned long) (*s - '0');
		if (v > AMOEBA_WORKERS_HARD_MAX)
			v = AMOEBA_WORKERS_HARD_MAX + 1ul;
	}
	*p = s;
	*out = v;
	return 0;
}

int amoeba_parse_range(const char *text, unsigned site_max,
		       struct amoeba_range *out, char *err, size_t errlen)
{
	char q[AMOEBA_QUOTE_MAX];
	const char *p = text;
	unsigned long min, max, limit;

	if (!text || !*text) {
		set_error(err, errlen,
			  ELASTIC_FLAG " needs a value MIN[:MAX], e.g. "
			  ELASTIC_FLAG "=2:8");
		return -1;
	}
	amoeba_quote(text, q, sizeof(q));
	if (scan_count(&p, &min) < 0)
		goto syntax;
	max = min;
	if (*p == ':') {
		p++;
		if (scan_count(&p, &max) < 0)
			goto syntax;
	}
	if (*p)
		goto syntax;

	if (min < 1) {
		set_error(err, errlen,
			  ELASTIC_FLAG "=%s: MIN must be at least 1 worker", q);
		return -1;
	}
	if (min > max && min <= AMOEBA_WORKERS_HARD_MAX) {
		set_error(err, errlen,
			  ELASTIC_FLAG "=%s: MIN (%lu) is above MAX (%lu); "
			  "write " ELASTIC_FLAG "=%lu:%lu", q, min, max, max,
			  min);
		return -1;
	}
	limit = site_max ? site_max : AMOEBA_WORKERS_HARD_MAX;
	if (min > limit || max > limit) {
		if (site_max)
			set_error(err, errlen,
				  ELASTIC_FLAG "=%s: asks for more than %lu "
				  "workers, this site's limit (max_workers in "
				  "plugstack.conf)", q, limit);
		else
			set_error(err, errlen,
				  ELASTIC_FLAG "=%s: asks for more than %lu "
				  "workers, the most the plugin allows", q,
				  limit);
		return -1;
	}
	out->min = (unsigned) min;
	out->max = (unsigned) max;
	return 0;

syntax:
	set_error(err, errlen,
		  ELASTIC_FLAG "=%s: expected MIN[:MAX] in whole numbers, "
		  "e.g. " ELASTIC_FLAG "=2:8 (MIN alone means MAX=MIN)", q);
	return -1;
}

static bool is_partition_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

int amoeba_parse_partition(const char *text, const char *what, char *out,
			   char *err, size_t errlen)
{
	char q[AMOEBA_QUOTE_MAX];
	size_t len;

	if (!text || !*text) {
		set_error(err, errlen, "%s needs a partition NAME", what);
		return -1;
	}
	amoeba_quote(text, q, sizeof(q));
	len = strnlen(text, AMOEBA_PARTITION_MAX + 1);
	if (len > AMOEBA_PARTITION_MAX) {
		set_error(err, errlen,
			  "%s=%s: a partition name has at most %d characters",
			  what, q, AMOEBA_PARTITION_MAX);
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		if (!is_partition_char(text[i])) {
			set_error(err, errlen,
				  "%s=%s: a partition name holds only letters, "
				  "digits, '.', '_' and '-'", what, q);
			return -1;
		}
	}
	memcpy(out, text, len + 1);
	return 0;
}

/* ---- plugstack.conf arguments: one table drives parsing and help ---- */

enum key_type { KEY_BOOL, KEY_COUNT, KEY_PARTITION, KEY_UID };

struct config_key {
	const char *name;
	enum key_type type;
	size_t offset;       /* of the field in struct amoeba_config */
	const char *syntax;  /* what the value looks like, for messages */
};

static const struct config_key config_keys[] = {
	{ "enabled", KEY_BOOL, offsetof(struct amoeba_config, enabled), "0|1" },
	{ "max_workers", KEY_COUNT,
	  offsetof(struct amoeba_config, max_workers), "N" },
	{ "default_partition", KEY_PARTITION,
	  offsetof(struct amoeba_config, default_partition), "NAME" },
	{ "sbatch_support", KEY_BOOL,
	  offsetof(struct amoeba_config, sbatch_support), "0|1" },
	{ "daemon_uid", KEY_UID,
	  offsetof(struct amoeba_config, daemon_uid), "UID" },
};
#define CONFIG_KEY_COUNT (sizeof(config_keys) / sizeof(config_keys[0]))

void amoeba_config_defaults(struct amoeba_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->enabled = AMOEBA_DEFAULT_ENABLED;
	cfg->max_workers = AMOEBA_DEFAULT_MAX_WORKERS;
	(void) snprintf(cfg->default_partition, sizeof(cfg->default_partition),
			"%s", AMOEBA_DEFAULT_PARTITION);
	cfg->sbatch_support = AMOEBA_DEFAULT_SBATCH_SUPPORT;
	cfg->daemon_uid = AMOEBA_DEFAULT_DAEMON_UID;
}

/* "enabled=0|1 (default 1), max_workers=N (default 1024), ..." */
static void describe_keys(char *buf, size_t buflen)
{
	struct amoeba_config def;
	size_t used = 0;

	amoeba_config_defaults(&def);
	buf[0] = '\0';
	for (size_t i = 0; i < CONFIG_KEY_COUNT && used < buflen; i++) {
		const struct config_key *k = &config_keys[i];
		const char *field = (const char *) &def + k->offset;
		char value[AMOEBA_PARTITION_MAX + 1];
		int n;

		switch (k->type) {
		case KEY_BOOL:
			(void) snprintf(value, sizeof(value), "%d",
					*(const bool *) field ? 1 : 0);
			break;
		case KEY_COUNT:
			(void) snprintf(value, sizeof(value), "%u",
					*(const unsigned *) field);
			break;
		case KEY_PARTITION:
			(void) snprintf(value, sizeof(value), "%s", field);
			break;
		case KEY_UID:
			(void) snprintf(value, sizeof(value), "none");
			break;
		}
		n = snprintf(buf + used, buflen - used, "%s%s=%s (default %s)",
			     i ? ", " : "", k->name, k->syntax, value);
		if (n < 0)
			break;
		used += (size_t) n;
	}
}

static const struct config_key *find_key(const char *name, size_t len)
{
	for (size_t i = 0; i < CONFIG_KEY_COUNT; i++) {
		if (strlen(config_keys[i].name) == len &&
		    strncmp(config_keys[i].name, name, len) == 0)
			return &config_keys[i];
	}
	return NULL;
}

static int set_key(struct amoeba_config *cfg, const struct config_key *k,
		   const char *arg, const char *value, char *err,
		   size_t errlen)
{
	char q[AMOEBA_QUOTE_MAX];
	char *field = (char *) cfg + k->offset;
	const char *p = value;
	unsigned long n;

	switch (k->type) {
	case KEY_BOOL:
		if ((value[0] != '0' && value[0] != '1') || value[1]) {
			set_error(err, errlen,
				  "plugstack.conf argument %s: %s takes 0 or 1",
				  amoeba_quote(arg, q, sizeof(q)), k->name);
			return -1;
		}
		*(bool *) field = value[0] == '1';
		return 0;
	case KEY_COUNT:
		if (scan_count(&p, &n) < 0 || *p || n < 1 ||
		    n > AMOEBA_WORKERS_HARD_MAX) {
			set_error(err, errlen,
				  "plugstack.conf argument %s: %s takes a whole "
				  "number from 1 to %u",
				  amoeba_quote(arg, q, sizeof(q)), k->name,
				  AMOEBA_WORKERS_HARD_MAX);
			return -1;
		}
		*(unsigned *) field = (unsigned) n;
		return 0;
	case KEY_UID: {
		size_t digits = strspn(value, "0123456789");

		n = 0;
		if (digits >= 1 && digits <= 10 && !value[digits])
			n = strtoul(value, NULL, 10);
		if (digits < 1 || digits > 10 || value[digits] ||
		    n > AMOEBA_DAEMON_UID_MAX) {
			set_error(err, errlen,
				  "plugstack.conf argument %s: %s takes the "
				  "numeric uid amoebad runs as (0 to %lu), e.g. "
				  "daemon_uid=990",
				  amoeba_quote(arg, q, sizeof(q)), k->name,
				  AMOEBA_DAEMON_UID_MAX);
			return -1;
		}
		*(long long *) field = (long long) n;
		return 0;
	}
	case KEY_PARTITION: {
		char what[64];

		(void) snprintf(what, sizeof(what),
				"plugstack.conf argument %s", k->name);
		return amoeba_parse_partition(value, what, field, err, errlen);
	}
	}
	return -1;
}

int amoeba_config_parse(struct amoeba_config *cfg, int ac, char *const av[],
			char *err, size_t errlen)
{
	char q[AMOEBA_QUOTE_MAX];
	char keys[256];
	bool seen[CONFIG_KEY_COUNT] = { false };
	struct amoeba_config parsed;

	amoeba_config_defaults(&parsed);
	for (int i = 0; i < ac; i++) {
		const char *arg = av[i];
		const char *eq;
		const struct config_key *k;

		if (!arg)
			continue;
		eq = strchr(arg, '=');
		k = eq ? find_key(arg, (size_t) (eq - arg)) : NULL;
		if (!k) {
			describe_keys(keys, sizeof(keys));
			set_error(err, errlen,
				  "plugstack.conf argument %s is not one of: %s",
				  amoeba_quote(arg, q, sizeof(q)), keys);
			return -1;
		}
		if (seen[k - config_keys]) {
			set_error(err, errlen,
				  "plugstack.conf argument %s: %s is given "
				  "twice", amoeba_quote(arg, q, sizeof(q)),
				  k->name);
			return -1;
		}
		seen[k - config_keys] = true;
		if (set_key(&parsed, k, arg, eq + 1, err, errlen) < 0)
			return -1;
	}
	*cfg = parsed;
	return 0;
}

int amoeba_parse_share(const char *text, char *out, char *err, size_t errlen)
{
	static const char *const modes[] = { "guaranteed", "opportunistic" };
	char q[AMOEBA_QUOTE_MAX];

	if (!text || !*text)
		text = AMOEBA_SHARE_DEFAULT;
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		if (strcmp(text, modes[i]) == 0) {
			(void) snprintf(out, AMOEBA_SHARE_MAX + 1, "%s", text);
			return 0;
		}
	}
	set_error(err, errlen,
		  SHARE_FLAG "=%s is not a sharing mode: give " SHARE_FLAG
		  "=guaranteed (the same as " SHARE_FLAG " alone) or "
		  SHARE_FLAG "=opportunistic", amoeba_quote(text, q, sizeof(q)));
	return -1;
}

/* ---- the job's request ---- */

void amoeba_request_reset(struct amoeba_request *req)
{
	memset(req, 0, sizeof(*req));
	req->mode = AMOEBA_MODE_UNSET;
}

int amoeba_request_apply(struct amoeba_request *req,
			 const struct amoeba_config *cfg, int option,
			 const char *optarg, bool in_job, char *err,
			 size_t errlen)
{
	struct amoeba_range range;
	char partition[AMOEBA_PARTITION_MAX + 1];
	char share[AMOEBA_SHARE_MAX + 1];

	switch (option) {
	case AMOEBA_OPT_ELASTIC:
		if (amoeba_parse_range(optarg, in_job ? 0 : cfg->max_workers,
				       &range, err, errlen) < 0)
			return -1;
		/* --no-elastic wins wherever it appears: slurmstepd sees the
		 * options as a set, not in the order the user gave them. */
		if (req->mode != AMOEBA_MODE_OFF) {
			req->mode = AMOEBA_MODE_ELASTIC;
			req->range = range;
		}
		return 0;
	case AMOEBA_OPT_PARTITION:
		if (amoeba_parse_partition(optarg, PARTITION_FLAG, partition,
					   err, errlen) < 0)
			return -1;
		memcpy(req->partition, partition, sizeof(partition));
		return 0;
	case AMOEBA_OPT_NO_ELASTIC:
		req->mode = AMOEBA_MODE_OFF;
		return 0;
	case AMOEBA_OPT_SHARE:
		if (amoeba_parse_share(optarg, share, err, errlen) < 0)
			return -1;
		memcpy(req->share, share, sizeof(share));
		return 0;
	}
	set_error(err, errlen, "unknown option number %d", option);
	return -1;
}

int amoeba_request_finish(struct amoeba_request *req,
			  const struct amoeba_config *cfg,
			  struct amoeba_env *env, bool *has_env, char *err,
			  size_t errlen)
{
	char q[AMOEBA_QUOTE_MAX];

	*has_env = false;
	memset(env, 0, sizeof(*env));
	env->vars[0].name = AMOEBA_ENV_ELASTIC_MIN;
	env->vars[1].name = AMOEBA_ENV_ELASTIC_MAX;
	env->vars[2].name = AMOEBA_ENV_ELASTIC_PARTITION;
	env->vars[3].name = AMOEBA_ENV_DAEMON_UID;
	env->vars[4].name = AMOEBA_ENV_SHARE;

	switch (req->mode) {
	case AMOEBA_MODE_UNSET:
		if (req->partition[0]) {
			set_error(err, errlen,
				  PARTITION_FLAG "=%s needs " ELASTIC_FLAG
				  "=MIN[:MAX] as well",
				  amoeba_quote(req->partition, q, sizeof(q)));
			return -1;
		}
		if (req->share[0]) {
			set_error(err, errlen,
				  SHARE_FLAG "=%s needs " ELASTIC_FLAG
				  "=MIN[:MAX] as well: only an elastic job's "
				  "agent can be told to share",
				  amoeba_quote(req->share, q, sizeof(q)));
			return -1;
		}
		return 0;
	case AMOEBA_MODE_OFF:
		env->set = false;
		*has_env = true;
		return 0;
	case AMOEBA_MODE_ELASTIC:
		if (!req->partition[0])
			memcpy(req->partition, cfg->default_partition,
			       sizeof(req->partition));
		env->set = true;
		(void) snprintf(env->vars[0].value, sizeof(env->vars[0].value),
				"%u", req->range.min);
		(void) snprintf(env->vars[1].value, sizeof(env->vars[1].value),
				"%u", req->range.max);
		(void) snprintf(env->vars[2].value, sizeof(env->vars[2].value),
				"%s", req->partition);
		if (cfg->daemon_uid >= 0)
			(void) snprintf(env->vars[3].value,
					sizeof(env->vars[3].value), "%lld",
					cfg->daemon_uid);
		(void) snprintf(env->vars[4].value, sizeof(env->vars[4].value),
				"%s", req->share);
		*has_env = true;
		return 0;
	}
	set_error(err, errlen, "unknown request mode %d", (int) req->mode);
	return -1;
}
