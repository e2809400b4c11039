/*
 * fake_spank.c - see fake_spank.h. Like Slurm 22.05, spank_setenv and
 * spank_unsetenv work only in the remote context.
 */
#include "fake_spank.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

spank_context_t fake_context = S_CTX_ERROR;
struct spank_option *fake_options[FAKE_MAX_OPTIONS];
int fake_option_count;
char fake_last_error[1024];

static struct {
	char name[64];
	char value[128];
	int used;
} fake_env[FAKE_MAX_ENV];

void fake_reset(spank_context_t context)
{
	fake_context = context;
	fake_option_count = 0;
	memset(fake_options, 0, sizeof(fake_options));
	memset(fake_env, 0, sizeof(fake_env));
	fake_last_error[0] = '\0';
}

struct spank_option *fake_option(const char *name)
{
	for (int i = 0; i < fake_option_count; i++)
		if (strcmp(fake_options[i]->name, name) == 0)
			return fake_options[i];
	return NULL;
}

const char *fake_step_getenv(const char *name)
{
	for (int i = 0; i < FAKE_MAX_ENV; i++)
		if (fake_env[i].used && strcmp(fake_env[i].name, name) == 0)
			return fake_env[i].value;
	return NULL;
}

void fake_step_setenv(const char *name, const char *value)
{
	int free_slot = -1;

	for (int i = 0; i < FAKE_MAX_ENV; i++) {
		if (fake_env[i].used && strcmp(fake_env[i].name, name) == 0) {
			free_slot = i;
			break;
		}
		if (!fake_env[i].used && free_slot < 0)
			free_slot = i;
	}
	if (free_slot < 0)
		return;
	fake_env[free_slot].used = 1;
	snprintf(fake_env[free_slot].name, sizeof(fake_env[0].name), "%s", name);
	snprintf(fake_env[free_slot].value, sizeof(fake_env[0].value), "%s",
		 value);
}

spank_context_t spank_context(void)
{
	return fake_context;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	(void) sp;
	if (fake_option_count >= FAKE_MAX_OPTIONS)
		return ESPANK_ERROR;
	fake_options[fake_option_count++] = opt;
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val,
			 int overwrite)
{
	(void) sp;
	if (fake_context != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (!overwrite && fake_step_getenv(var))
		return ESPANK_ENV_EXISTS;
	fake_step_setenv(var, val);
	return ESPANK_SUCCESS;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	const char *value = fake_step_getenv(var);

	(void) sp;
	if (fake_context != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	if (!value)
		return ESPANK_ENV_NOEXIST;
	if ((int) strlen(value) >= len)
		return ESPANK_NOSPACE;
	memcpy(buf, value, strlen(value) + 1);
	return ESPANK_SUCCESS;
}

spank_err_t spank_unsetenv(spank_t sp, const char *var)
{
	(void) sp;
	if (fake_context != S_CTX_REMOTE)
		return ESPANK_NOT_REMOTE;
	for (int i = 0; i < FAKE_MAX_ENV; i++)
		if (fake_env[i].used && strcmp(fake_env[i].name, var) == 0)
			fake_env[i].used = 0;
	return ESPANK_SUCCESS;
}

const char *spank_strerror(spank_err_t err)
{
	return err == ESPANK_SUCCESS ? "success" : "fake spank error";
}

void slurm_error(const char *format, ...)
{
	va_list ap;

	va_start(ap, format);
	vsnprintf(fake_last_error, sizeof(fake_last_error), format, ap);
	va_end(ap);
}

void slurm_verbose(const char *format, ...)
{
	(void) format;
}
