"""Insights: a catalogue of rules that say, with numbers, what slowed a job's I/O.

In the spirit of Drishti (Bez et al., PDSW'22; hpc-io/drishti-io): every rule has an id,
a severity (``high``, ``warn``, ``info``), the evidence (numbers) and recommendations.
Thresholds come from ONE config, :class:`pharos_analytics.diagnosis_config.DiagnosisConfig`
(defaults and their sources documented there; each rule's docstring names its source and
its threshold's unit).

Two sources of evidence, named in each insight's ``source``:

* ``counters``: the job's imported Darshan counters (``darshan_counters``); complete for
  the whole run even when DXT traces overflowed, so rules that both sources can answer
  use the counters when a job has them.
* ``trace``: the job's requests in ``io_requests`` (the eBPF agent, or DXT segments),
  client layer; used for jobs without counters, and for what counters cannot tell
  (reads after writes of the same bytes, sustained metadata rate, storage targets).

Aggregation runs in ClickHouse (one pass per query over the job's rows); Python applies
the rules to the few aggregate rows, and runs the one sequential analysis
(read-after-write) over at most ``scan_max_records`` records.

Where each part lives: :mod:`.evidence` (the counters and trace views the rules read, and
their SQL), the rules grouped by what they judge (:mod:`.requests`: request sizes, alignment,
order; :mod:`.imbalance`: ranks; :mod:`.metadata`; :mod:`.files`; :mod:`.targets`: storage
targets and other shared resources), :mod:`.weigh` (the significance that orders them) and
:mod:`.run` (the catalogue in order, :func:`job_insights`).
"""

from .model import Insight, JobInsights
from .run import catalogue, job_insights

__all__ = ["Insight", "JobInsights", "catalogue", "job_insights"]
