/*
 * amoeba_env.h - the names of the job environment contract, for C.
 *
 * The one Python spelling is slurm_amoeba/core/jobenv.py (JobEnv); this header
 * mirrors it name for name, and tests/unit/test_jobenv.py fails when the two
 * lists differ in either direction. The plugin sets the first three (the
 * worker range and the satellites' partition); the others are written by
 * amoeba-sbatch, the executor and the job's agent, and are listed here so that
 * C code never spells an AMOEBA_* variable as a literal of its own.
 */
#ifndef AMOEBA_ENV_H
#define AMOEBA_ENV_H

#define AMOEBA_ENV_ELASTIC_MIN "AMOEBA_ELASTIC_MIN"
#define AMOEBA_ENV_ELASTIC_MAX "AMOEBA_ELASTIC_MAX"
#define AMOEBA_ENV_ELASTIC_PARTITION "AMOEBA_ELASTIC_PARTITION"
#define AMOEBA_ENV_GPUS_PER_WORKER "AMOEBA_GPUS_PER_WORKER"
#define AMOEBA_ENV_CPUS_PER_WORKER "AMOEBA_CPUS_PER_WORKER"
#define AMOEBA_ENV_DAEMON_ENDPOINT "AMOEBA_DAEMON_ENDPOINT"
#define AMOEBA_ENV_DAEMON_UID "AMOEBA_DAEMON_UID"
#define AMOEBA_ENV_STATE_DIR "AMOEBA_STATE_DIR"
#define AMOEBA_ENV_SHARE "AMOEBA_SHARE"
#define AMOEBA_ENV_SHARE_PARTITION "AMOEBA_SHARE_PARTITION"
#define AMOEBA_ENV_PARENT_JOB "AMOEBA_PARENT_JOB"
#define AMOEBA_ENV_JOB_FOLDER "AMOEBA_JOB_FOLDER"

#endif /* AMOEBA_ENV_H */
