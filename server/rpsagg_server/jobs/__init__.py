"""The jobs of a server, in one place.

- :mod:`~rpsagg_server.jobs.catalog`: the one catalog of every job (the default job, the
  created ones, queued, running or ended, and the past jobs moved aside), one string id each;
- :mod:`~rpsagg_server.jobs.pastjobs`: a finished job's database moved to ``<db>.jobs/``
  (``--on-finished-job new``), and the wire's job number (``RoundInfo.job_id``);
- :mod:`~rpsagg_server.jobs.sizing`: what a job's settings imply (request limit, memory);
- :mod:`~rpsagg_server.jobs.jobruntime`: one open job (store, bus, read model, engine);
- :mod:`~rpsagg_server.jobs.firstjoin`: a ``--d 0`` job waiting for the first join's d;
- :mod:`~rpsagg_server.jobs.defaultjob`: the job of the server's flags and its catalog row;
- :mod:`~rpsagg_server.jobs.jobhost`: the jobs of one server (route, create, cancel);
- :mod:`~rpsagg_server.jobs.scheduling`: which queued job starts when (``--max-jobs``);
- :mod:`~rpsagg_server.jobs.jobviews`: a job as ``GET /api/jobs/{id}`` shows it, and the
  summary an ended job's row keeps;
- :mod:`~rpsagg_server.jobs.endedjobs`: an ended job closed, and opened again to be read;
- :mod:`~rpsagg_server.jobs.restore`: what a start reopens (the running jobs only);
- :mod:`~rpsagg_server.jobs.retention`: the ended jobs kept (``--keep-finished-jobs``,
  ``--keep-finished-for``), the others removed.

This package's own namespace holds only the past jobs' functions, so that importing it never
imports the engine.
"""

from rpsagg_server.jobs.pastjobs import (
    ON_FINISHED_JOB,
    PastJob,
    archive_finished_job,
    jobs_dir,
    past_jobs,
)

__all__ = ["ON_FINISHED_JOB", "PastJob", "archive_finished_job", "jobs_dir", "past_jobs"]
