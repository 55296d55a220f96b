"""``/metrics`` of every job: the series of the running jobs and of the last ended ones, each
labelled ``job``; the counters and histograms of the jobs that ended before those, summed
under ``job="(ended)"`` (so that a sum over every job keeps counting while the gone jobs'
own series drop out, as Prometheus advises for things that are gone); and
``rpsagg_jobs{state}``.

An ended job's counts are summed once, when it drops out of the kept ones: a scrape costs
the running and kept jobs, not every job ever run. What such a job counts after that (the
cache reads of its downloads, a refused submission) is not added: the sums never go down,
and may stay below the full count.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from rpsagg_server.jobs.jobhost import JobHost
from rpsagg_server.jobs.jobruntime import JobRuntime

#: the ended jobs whose own series ``/metrics`` keeps: the most recently ended
KEEP_ENDED = 8
#: the ``job`` label of the summed series of the jobs ended before those
ENDED_LABEL = "(ended)"
_CUMULATIVE = ("counter", "histogram")


class JobsCollector(Collector):
    """The jobs' series (module docstring).

    Parameters
    ----------
    host : JobHost
        The jobs.
    keep_ended : int
        How many of the most recently ended jobs keep their own series.
    """

    def __init__(self, host: JobHost, keep_ended: int = KEEP_ENDED) -> None:
        self.host = host
        self.keep_ended = keep_ended
        host.retention.on_remove.append(self._removed)
        self._folded: set[str] = set()
        #: (family, sample name, labels) -> the sum over the folded jobs
        self._sums: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        self._meta: dict[str, tuple[str, str, str]] = {}  # family -> doc, type, unit

    def describe(self) -> Iterable[Metric]:
        """None: the families change as jobs come and go."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The kept jobs' families merged by name, each sample labelled with its job; the
        folded jobs' sums; the jobs by state."""
        families: dict[str, Metric] = {}
        for job_id, rt in self._shown():
            if rt.registry is None:
                continue
            for fam in rt.registry.collect():
                out = self._family(families, fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    out.samples.append(s._replace(labels={**s.labels, "job": job_id}))
        for (name, sample, labels), value in self._sums.items():
            out = self._family(families, name, *self._meta[name])
            out.samples.append(Sample(sample, {**dict(labels), "job": ENDED_LABEL}, value))
        jobs = Metric("rpsagg_jobs", "Jobs of this server by state", "gauge")
        for state, n in self.host.counts().items():
            jobs.add_sample("rpsagg_jobs", {"state": state}, n)
        yield jobs
        yield from families.values()

    @staticmethod
    def _family(families: dict[str, Metric], name: str, doc: str, kind: str,
                unit: str) -> Metric:
        out = families.get(name)
        if out is None:
            out = families[name] = Metric(name, doc, kind, unit)
        return out

    def _shown(self) -> list[tuple[str, JobRuntime]]:
        """The jobs with series of their own (the ones ended before them folded first)."""
        shown: list[tuple[str, JobRuntime]] = []
        ended: list[tuple[str, JobRuntime]] = []
        for job_id, rt in list(self.host.jobs.items()):
            if job_id in self._folded:
                continue
            (ended if rt.engine.job_done and not rt.default else shown).append((job_id, rt))
        records = self.host.listing.records
        ended.sort(key=lambda e: (getattr(records.get(e[0]), "finished_at", None) or 0.0))
        cut = max(len(ended) - self.keep_ended, 0)
        for job_id, rt in ended[:cut]:
            self._fold(job_id, rt)
        return shown + ended[cut:]

    def _removed(self, job_id: str, rt: JobRuntime | None) -> None:
        """A job about to be removed: its counts go to the sums (if not there yet)."""
        if rt is not None and job_id not in self._folded:
            self._fold(job_id, rt)

    def _fold(self, job_id: str, rt: JobRuntime) -> None:
        """Add an ended job's cumulative series to the sums, once."""
        self._folded.add(job_id)
        if rt.registry is None:
            return
        for fam in rt.registry.collect():
            if fam.type not in _CUMULATIVE:
                continue
            self._meta.setdefault(fam.name, (fam.documentation, fam.type, fam.unit))
            for s in fam.samples:
                if s.name.endswith("_created"):  # a timestamp, not a count
                    continue
                key = (fam.name, s.name, tuple(sorted(s.labels.items())))
                self._sums[key] = self._sums.get(key, 0.0) + s.value
