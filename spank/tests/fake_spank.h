/*
 * fake_spank.h - a stand-in for the part of Slurm's SPANK API the plugin
 * uses, so tests/test_plugin.c can drive the real hooks in one process.
 */
#ifndef AMOEBA_FAKE_SPANK_H
#define AMOEBA_FAKE_SPANK_H

#include <slurm/spank.h>

#define FAKE_MAX_OPTIONS 8
#define FAKE_MAX_ENV 8

extern spank_context_t fake_context;
extern struct spank_option *fake_options[FAKE_MAX_OPTIONS];
extern int fake_option_count;
extern char fake_last_error[1024];

/* Forget registered options, the step environment and the last error. */
void fake_reset(spank_context_t context);
/* The registered option named name, or NULL. */
struct spank_option *fake_option(const char *name);
/* The step environment kept by spank_setenv (remote context), or NULL. */
const char *fake_step_getenv(const char *name);
void fake_step_setenv(const char *name, const char *value);

#endif /* AMOEBA_FAKE_SPANK_H */
