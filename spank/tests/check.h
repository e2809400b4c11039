/*
 * check.h - the few assertion macros the C tests use: a failed check prints
 * where and what, counts, and the test goes on; CHECK_DONE() sets the exit
 * status.
 */
#ifndef AMOEBA_CHECK_H
#define AMOEBA_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                          \
	do {                                                                 \
		check_count++;                                               \
		if (!(cond)) {                                               \
			check_failures++;                                    \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                            \
		}                                                            \
	} while (0)

#define CHECK_STR(got, want)                                                 \
	do {                                                                 \
		const char *got_ = (got), *want_ = (want);                   \
		check_count++;                                               \
		if (!got_ || strcmp(got_, want_) != 0) {                     \
			check_failures++;                                    \
			fprintf(stderr, "%s:%d: %s is \"%s\", want \"%s\"\n",  \
				__FILE__, __LINE__, #got,                    \
				got_ ? got_ : "(null)", want_);              \
		}                                                            \
	} while (0)

/* The message contains needle. */
#define CHECK_HAS(msg, needle)                                               \
	do {                                                                 \
		const char *msg_ = (msg), *needle_ = (needle);               \
		check_count++;                                               \
		if (!msg_ || !strstr(msg_, needle_)) {                       \
			check_failures++;                                    \
			fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", \
				__FILE__, __LINE__, msg_ ? msg_ : "(null)",   \
				needle_);                                    \
		}                                                            \
	} while (0)

#define CHECK_DONE(name)                                                     \
	(fprintf(stderr, "%s: %d checks, %d failed\n", (name), check_count,  \
		 check_failures),                                            \
	 check_failures ? 1 : 0)

#endif /* AMOEBA_CHECK_H */
