"""``/metrics`` of every job: the series of the open jobs (the running ones, the default
job) and of the last ended ones, each labelled ``job``; the counters and histograms of the
jobs that ended before those, summed under ``job="(ended)"`` (so that a sum over every job
keeps counting while the gone jobs' own series drop out, as Prometheus advises for things
that are gone); and ``rpsagg_jobs{state}``.

An ended created job's series are taken once, as it closes
(:attr:`~rpsagg_server.jobs.endedjobs.EndedJobs.on_retire`): they no longer change. Its
counts are summed once, when it drops out of the kept ones: a scrape costs the open and
kept jobs, not every job ever run. Reading a closed job later (its downloads) counts in a
runtime that ``/metrics`` does not show. The sums start again from zero at a restart, as
every counter of the process does.
"""

from __future__ import annotations

from collections import OrderedDict
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
        host.ended.on_retire.append(self._retired)
        host.retention.on_remove.append(self._removed)
        #: the last ended jobs' series, as they closed, the first ended first
        self._kept: OrderedDict[str, list[Metric]] = OrderedDict()
        #: (family, sample name, labels) -> the sum over the folded jobs
        self._sums: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        self._meta: dict[str, tuple[str, str, str]] = {}  # family -> doc, type, unit

    def describe(self) -> Iterable[Metric]:
        """None: the families change as jobs come and go."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The open and kept jobs' families merged by name, each sample labelled with its
        job; the folded jobs' sums; the jobs by state."""
        families: dict[str, Metric] = {}
        shown = [(job_id, list(rt.registry.collect())) for job_id, rt
                 in list(self.host.jobs.items()) if rt.registry is not None]
        for job_id, fams in [*shown, *self._kept.items()]:
            for fam in fams:
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

    def _retired(self, rt: JobRuntime) -> None:
        """An ended job closes: its series, as they are now, kept; the first ended of the
        kept ones beyond :attr:`keep_ended` folded into the sums."""
        if rt.registry is None:
            return
        self._kept[rt.id] = list(rt.registry.collect())
        while len(self._kept) > self.keep_ended:
            self._fold(*self._kept.popitem(last=False))

    def _removed(self, job_id: str) -> None:
        """A job about to be removed: its counts go to the sums (if not there yet)."""
        fams = self._kept.pop(job_id, None)
        if fams is not None:
            self._fold(job_id, fams)

    def _fold(self, job_id: str, fams: list[Metric]) -> None:
        """Add an ended job's cumulative series to the sums."""
        for fam in fams:
            if fam.type not in _CUMULATIVE:
                continue
            self._meta.setdefault(fam.name, (fam.documentation, fam.type, fam.unit))
            for s in fam.samples:
                if s.name.endswith("_created"):  # a timestamp, not a count
                    continue
                key = (fam.name, s.name, tuple(sorted(s.labels.items())))
                self._sums[key] = self._sums.get(key, 0.0) + s.value
