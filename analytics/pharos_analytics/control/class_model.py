"""Learned DFRA job classes: a class (and a bandwidth) for a job that has no exact history.

Source: DFRA (Ji et al., FAST'19 §3-4) decides a job's forwarding resources at dispatch from
the history of the same application's earlier runs (here, :mod:`.dfra`: same name, user and
command); a job whose name, user and command never ran gets the default mapping. This module
learns from the stored history what the exact-match rule cannot use: a new job still
resembles earlier ones (the same executable, a similar rank count, the same user's other jobs,
the same argument tokens). A scikit-learn classifier predicts its DFRA class, a regressor its
I/O numbers (bandwidth for the sizing of :func:`~.dfra.wanted_nodes`); the prediction is used
only when the classifier's probability of its class reaches ``[control]
dfra_model_min_confidence``, else the job keeps the default (DFRA's behaviour without history).

**Features** (known at dispatch, before the first I/O: the job's start event or the hint's
arguments), :func:`job_features`:

* ``exe=<name>``: the executable's base name: the first word of the command that is not a
  launcher (``mpiexec``, ``mpirun``, ``srun``... and their options), a wrapper (``env``,
  ``time``, ``numactl``...), an environment assignment or a shell (``sh -c SCRIPT``: the
  script's first command); ``launcher=<name>`` (``none`` without one);
* ``user=<user>``: the job's user, so a user's other jobs count;
* ``name=<token>``: the job name's alphabetic tokens (``ckpt-run-17`` -> ``ckpt``, ``run``);
* ``arg=<token>``: every argument word after the executable, lower-cased, paths reduced to
  their base name and digit runs to ``#`` (``--size=32m`` -> ``--size=#m``), at most 64;
  ``opt=<key>`` for each ``--key=value`` / ``-k`` option;
* ``log2_ranks`` (log2 of the job's ranks, 0 unknown) and ``ranks_known`` (1/0): similar
  rank counts are near;
* ``log2_arg_bytes``: log2 of the largest size-like argument in bytes (``32m``, ``4GiB``;
  0 none), so a new size between two seen ones is between them.

Token features are one-hot (a token never seen in training is ignored), the numbers scaled to
[0, 1] by their training maximum (``MaxAbsScaler``).

**Labels**: the class the exact-match rule would give a job that had run before exactly as
this one did: :func:`~.dfra.classify` of the job's own profile numbers
(:func:`~pharos_analytics.profiles.job_metrics`), with the thresholds in force
(:class:`~.config.ControlConfig`, :class:`~pharos_analytics.diagnosis_config.DiagnosisConfig`);
so retraining follows a change of thresholds. Regression targets: log1p of the profile
numbers (bandwidth B/s, bytes, metadata ops/s, span s, I/O ranks, forwarding nodes, data
requests, metadata ops).

**Evaluation** (:func:`evaluate`, ``bench/dfra_class_model.py``): jobs ordered by start time,
the model trained on the first share, every later job predicted; the exact-match rule sees,
for each later job, every job that started before it (as in production).
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.feature_extraction import DictVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import confusion_matrix
from sklearn.preprocessing import MaxAbsScaler

from pharos_core.store import Store

from ..diagnosis_config import DiagnosisConfig
from ..profiles import JobMetrics, job_metrics
from .config import ControlConfig
from .dfra import DfraClass, JobHistory, LearnedClass, classify, history_from_metrics

#: The DFRA classes, in the order of confusion matrices (rows: true class, columns: predicted).
CLASSES: tuple[DfraClass, ...] = ("default", "more_nodes", "dedicated")

#: Finished jobs (start and end events) that started from ``since`` on, newest first: the
#: training history (their I/O numbers come from :func:`~pharos_analytics.profiles.job_metrics`).
FINISHED_JOBS_SQL = """
SELECT job_id, anyIf(name, kind = 'start') AS name, anyIf(user, kind = 'start') AS user,
       anyIf(command, kind = 'start') AS command, anyIf(ranks, kind = 'start') AS ranks,
       toUnixTimestamp64Nano(minIf(time, kind = 'start')) AS start_ns
FROM job_events FINAL
GROUP BY job_id
HAVING countIf(kind = 'start') > 0 AND countIf(kind = 'end') > 0 AND start_ns >= {since:Int64}
ORDER BY start_ns DESC
LIMIT {limit:UInt32}
"""

#: The ranks of a job's start event (0: none yet, or not recorded).
START_RANKS_SQL = """
SELECT anyIf(ranks, kind = 'start') AS ranks FROM job_events FINAL WHERE job_id = {job_id:String} GROUP BY job_id
"""

#: Profile numbers the regressor predicts (log1p each): the numeric fields of :class:`~.dfra.JobHistory`.
TARGETS = (
    "bandwidth_b_s",
    "bytes",
    "metadata_ops_s",
    "span_s",
    "io_ranks",
    "forwarding_nodes",
    "data_requests",
    "metadata_ops",
)

LAUNCHERS = frozenset({"mpiexec", "mpirun", "mpiexec.hydra", "orterun", "prterun", "srun", "aprun", "jsrun"})
#: Launcher options followed by a value word (``-n 4``, ``--host a,b``).
_LAUNCHER_VALUE_OPTS = frozenset(
    {"-n", "-np", "-c", "-N", "--ntasks", "-ppn", "--ppn", "-host", "--host", "-hosts", "-f", "--hostfile"}
    | {"-machinefile", "--mpi", "-p", "--partition", "-t", "--time", "-w", "--nodelist", "-A", "--account"}
)
WRAPPERS = frozenset({"env", "exec", "time", "nice", "nohup", "numactl", "taskset", "stdbuf", "timeout", "chrt"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
#: Commands of a ``sh -c`` script that are not the job's program (the first other one is).
_SHELL_BUILTINS = frozenset(
    {"cd", "export", "set", "true", ":", "echo", "mkdir", "rm", "ulimit", "umask", "source", "."}
)
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([kmgtp])(?:i?b)?(?![a-z])", re.IGNORECASE)
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_MAX_ARGS = 64


@dataclass(frozen=True)
class JobIdentity:
    """What is known of a job at dispatch: name, user, argv (``command``) and ranks (0: unknown)."""

    name: str
    user: str
    command: tuple[str, ...]
    ranks: int = 0


@dataclass
class Sample:
    """One finished job of the history: its identity, start (ns since the epoch), its profile
    numbers (:class:`~pharos_analytics.profiles.JobMetrics`) and its label (DFRA class)."""

    job_id: str
    ident: JobIdentity
    start_ns: int
    metrics: JobMetrics
    label: DfraClass


# -- features -----------------------------------------------------------------------------------
def _words(command: tuple[str, ...] | list[str]) -> tuple[str, list[str]]:
    """(launcher or '', the words from the executable on) of an argv: launchers with their
    options, wrappers, VAR=value assignments and ``sh -c SCRIPT`` (the script's words) skipped."""
    words = [w for w in command if w]
    launcher = ""
    i = 0
    while i < len(words):
        w = words[i]
        base = w.rsplit("/", 1)[-1]
        if base in LAUNCHERS:
            launcher = launcher or base
            i += 1
            while i < len(words) and (words[i].startswith("-") or words[i].isdigit()):
                i += 2 if words[i] in _LAUNCHER_VALUE_OPTS else 1
            continue
        if base in WRAPPERS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w):
            i += 1
            while base in WRAPPERS and i < len(words) and words[i].startswith("-"):
                i += 1
            continue
        if base in SHELLS:
            rest = words[i + 1 :]
            if "-c" in rest and rest.index("-c") + 1 < len(rest):
                for part in re.split(r";|&&|\|\||\n", rest[rest.index("-c") + 1]):
                    try:
                        inner = shlex.split(part)
                    except ValueError:
                        inner = part.split()
                    inner_launcher, inner_words = _words(inner)
                    if inner_words and inner_words[0].rsplit("/", 1)[-1] not in _SHELL_BUILTINS:
                        return launcher or inner_launcher, inner_words
                return launcher, []
            i += 1
            continue
        return launcher, words[i:]
    return launcher, []


def executable(command: tuple[str, ...] | list[str]) -> str:
    """The base name of the program a command runs ('' when none): see :func:`job_features`."""
    _, words = _words(command)
    return words[0].rsplit("/", 1)[-1] if words else ""


def _token(word: str) -> str:
    w = word.lower()
    if "/" in w:
        head, _, tail = w.partition("=") if w.startswith("-") and "=" in w else ("", "", w)
        base = tail.rstrip("/").rsplit("/", 1)[-1]
        w = f"{head}={base}" if head else base
    return re.sub(r"\d+", "#", w)[:64]


def arg_bytes(words: list[str]) -> float:
    """The largest size-like value among ``words`` in bytes (``32m``, ``1.5GiB``, ``--bs=4k``);
    0 when none."""
    best = 0.0
    for w in words:
        for num, unit in _SIZE.findall(w):
            best = max(best, float(num) * _UNITS[unit.lower()])
    return best


def job_features(ident: JobIdentity) -> dict[str, float]:
    """The features of a job (module doc): one-hot tokens (value 1.0) and the numbers
    ``log2_ranks``, ``ranks_known``, ``log2_arg_bytes``. Pure."""
    launcher, words = _words(ident.command)
    exe = words[0].rsplit("/", 1)[-1] if words else ""
    f: dict[str, float] = {
        f"exe={exe}": 1.0,
        f"launcher={launcher or 'none'}": 1.0,
        f"user={ident.user}": 1.0,
        "log2_ranks": math.log2(ident.ranks) if ident.ranks > 0 else 0.0,
        "ranks_known": 1.0 if ident.ranks > 0 else 0.0,
    }
    for tok in re.split(r"[^a-z]+", ident.name.lower()):
        if len(tok) >= 2:
            f[f"name={tok}"] = 1.0
    args = words[1 : 1 + _MAX_ARGS]
    for w in args:
        f[f"arg={_token(w)}"] = 1.0
        if w.startswith("-"):
            f[f"opt={w.split('=', 1)[0].lower()}"] = 1.0
    b = arg_bytes(args)
    f["log2_arg_bytes"] = math.log2(b) if b > 0 else 0.0
    return f


# -- the model ----------------------------------------------------------------------------------
def label_of(m: JobMetrics, cfg: ControlConfig, diag: DiagnosisConfig | None = None) -> DfraClass:
    """The DFRA class of one run's own numbers (:func:`~.dfra.classify` of a one-run history)."""
    return classify(history_from_metrics([m]), cfg, diag)[0]


def _classifier(kind: str):
    if kind == "logistic":
        return LogisticRegression(C=1.0, max_iter=5000, class_weight="balanced")
    # every feature at every split (bagged trees): the few numeric features (ranks, sizes) that part
    # one command's classes are offered to each split, not 1 in sqrt(n) of ~100 tokens (the bench)
    return RandomForestClassifier(n_estimators=200, max_features=None, random_state=0, n_jobs=1)


class ClassModel:
    """A trained job-class model (module doc). Build it with :meth:`fit`; :meth:`predict` a job.
    ``jobs``: training jobs, ``trained_ns``: when, ``classes``: the classes seen in training."""

    NEIGHBOURS = 3

    def __init__(self, samples: list[Sample], cfg: ControlConfig, trained_ns: int = 0) -> None:
        self.cfg = cfg
        self.trained_ns = trained_ns
        self.jobs = [s.job_id for s in samples]
        self.vectorizer = DictVectorizer(sparse=True)
        self.scaler = MaxAbsScaler()
        x = self.scaler.fit_transform(self.vectorizer.fit_transform([job_features(s.ident) for s in samples]))
        self._x = x
        y = [s.label for s in samples]
        self.classes = sorted(set(y), key=CLASSES.index)
        self.classifier = _classifier(cfg.dfra_model_classifier).fit(x, y)
        pats = [s.metrics.pattern for s in samples]
        self._pattern = (
            _classifier(cfg.dfra_model_classifier).fit(x, pats) if len(set(pats)) > 1 else pats[0] if pats else ""
        )
        t = np.log1p(np.array([[max(s.metrics.numbers[k], 0.0) for k in TARGETS] for s in samples]))
        self.regressor = RandomForestRegressor(n_estimators=100, random_state=0, n_jobs=1).fit(x, t)

    @classmethod
    def fit(cls, samples: list[Sample], cfg: ControlConfig, trained_ns: int = 0) -> tuple[ClassModel | None, str]:
        """(the model, '') or (None, why not): fewer than ``dfra_model_min_jobs`` samples, or
        only one class among them (nothing to tell apart). Pure."""
        if len(samples) < cfg.dfra_model_min_jobs:
            return (
                None,
                f"{len(samples)} finished jobs with I/O in the history, the model needs {cfg.dfra_model_min_jobs}",
            )
        labels = Counter(s.label for s in samples)
        if len(labels) < 2:
            return None, f"every job of the history is {next(iter(labels))}: nothing to learn"
        return cls(samples, cfg, trained_ns), ""

    def predict(self, ident: JobIdentity) -> LearnedClass:
        """The class, confidence and estimated profile of ``ident`` (a job without exact history).
        Not confident (probability < ``dfra_model_min_confidence``): ``klass`` is ``default``. Pure."""
        feats = job_features(ident)
        x = self.scaler.transform(self.vectorizer.transform([feats]))
        proba = self.classifier.predict_proba(x)[0]
        probs = {str(c): float(p) for c, p in zip(self.classifier.classes_, proba, strict=True)}
        predicted: DfraClass = max(probs, key=lambda c: probs[c])  # type: ignore[assignment]
        conf = probs[predicted]
        est = {k: float(v) for k, v in zip(TARGETS, np.expm1(self.regressor.predict(x)[0]).clip(min=0.0), strict=True)}
        sims = (self._x @ x.T).toarray().ravel()
        norms = np.sqrt(np.asarray(self._x.multiply(self._x).sum(axis=1)).ravel()) * max(
            math.sqrt(float(x.multiply(x).sum())), 1e-12
        )
        cos = sims / np.maximum(norms, 1e-12)
        near = [int(i) for i in np.argsort(-cos, kind="stable")[: self.NEIGHBOURS]]
        pattern = self._pattern if isinstance(self._pattern, str) else str(self._pattern.predict(x)[0])
        hist = JobHistory(runs=0, jobs=[self.jobs[i] for i in near], pattern=pattern, **est)
        need = self.cfg.dfra_model_min_confidence
        confident = conf >= need
        klass: DfraClass = predicted if confident else "default"
        similar = ", ".join(f"{self.jobs[i]} ({cos[i]:.2f})" for i in near)
        if confident:
            reason = (
                f"learned class {predicted} at confidence {conf:.2f} >= {need:g} (most similar earlier jobs: {similar})"
            )
        else:
            reason = f"learned class {predicted} at confidence {conf:.2f} < {need:g}: unsure, default mapping"
        evidence = {
            "predicted": predicted,
            "confidence": round(conf, 4),
            "min_confidence": need,
            "probabilities": {k: round(v, 4) for k, v in probs.items()},
            "similar_jobs": [{"job_id": self.jobs[i], "cosine": round(float(cos[i]), 4)} for i in near],
            "predicted_bandwidth_b_s": hist.bandwidth_b_s,
            "predicted_bytes": hist.bytes,
            "features": sorted(k for k, v in feats.items() if v and k in self.vectorizer.vocabulary_),
            "classifier": self.cfg.dfra_model_classifier,
            "training_jobs": len(self.jobs),
        }
        return LearnedClass(klass, predicted, conf, confident, probs, hist, reason, evidence)


# -- the history from the store -----------------------------------------------------------------
def training_samples(
    store: Store,
    cfg: ControlConfig,
    diag: DiagnosisConfig | None = None,
    now_ns: int | None = None,
    exclude: str = "",
) -> list[Sample]:
    """The finished jobs with I/O (bytes or metadata ops) among the newest ``dfra_model_max_jobs``
    that started within ``dfra_model_lookback_s`` before ``now_ns`` (None: no bound), oldest
    first, labelled with the thresholds of ``cfg``/``diag``; ``exclude``: a job id left out.
    Raises StoreError."""
    since = 0 if now_ns is None else now_ns - int(cfg.dfra_model_lookback_s * 1e9)
    rows = store.query(FINISHED_JOBS_SQL, {"since": since, "limit": cfg.dfra_model_max_jobs})
    rows = [r for r in rows if r["job_id"] != exclude]
    if not rows:
        return []
    by_id = {m.job_id: m for m in job_metrics(store, job_ids=[r["job_id"] for r in rows])}
    out = []
    for r in rows:
        m = by_id.get(r["job_id"])
        if m is None or not (m.numbers["bytes"] > 0 or m.numbers["metadata_ops"] > 0):
            continue
        ident = JobIdentity(r["name"] or "", r["user"] or "", tuple(r["command"] or ()), int(r["ranks"] or 0))
        out.append(Sample(r["job_id"], ident, int(r["start_ns"]), m, label_of(m, cfg, diag)))
    out.sort(key=lambda s: (s.start_ns, s.job_id))
    return out


def start_ranks(store: Store, job_id: str) -> int:
    """The ranks of ``job_id``'s start event; 0 when it has none. Raises StoreError."""
    rows = store.query(START_RANKS_SQL, {"job_id": job_id})
    return int(rows[0]["ranks"] or 0) if rows else 0


# -- evaluation ---------------------------------------------------------------------------------
def exact_match_class(
    before: list[Sample], ident: JobIdentity, cfg: ControlConfig, diag: DiagnosisConfig | None = None
) -> tuple[DfraClass, JobHistory | None]:
    """The exact-match rule of :func:`~.dfra.job_history` + :func:`~.dfra.classify` on samples
    (oldest first) that started before the job: the newest ``dfra_history_runs`` with the same
    name, user and command. Pure."""
    same = [
        s for s in before if (s.ident.name, s.ident.user, s.ident.command) == (ident.name, ident.user, ident.command)
    ]
    same = same[::-1][: cfg.dfra_history_runs]
    h = history_from_metrics([s.metrics for s in same])
    return classify(h, cfg, diag)[0], h


@dataclass
class Evaluation:
    """A time-ordered evaluation (:func:`evaluate`). ``policies``: name -> accuracy over the test
    jobs, over the test jobs without exact history (``unseen``), and the confusion matrix (rows
    true, columns predicted, in :data:`CLASSES` order); ``rows``: one dict per test job."""

    train: int
    test: int
    unseen: int
    split_ns: int
    policies: dict[str, dict]
    rows: list[dict]
    fallbacks: int
    bandwidth_log_error: dict[str, float]


def evaluate(
    samples: list[Sample],
    cfg: ControlConfig,
    diag: DiagnosisConfig | None = None,
    train_share: float = 0.6,
) -> Evaluation:
    """Train on the first ``train_share`` of ``samples`` by start time, predict the rest.

    Policies: ``exact`` (exact-match rule, every earlier job visible), ``model`` (the learned
    class with the confidence fallback, for every test job), ``exact+model`` (what the control
    loop does: exact match when the job has history, else the model). Bandwidth error: median
    |log10(predicted / true)| of the model and of exact match (jobs with history only).
    Raises ValueError when the training part cannot give a model (:meth:`ClassModel.fit`)."""
    samples = sorted(samples, key=lambda s: (s.start_ns, s.job_id))
    n_train = max(1, round(len(samples) * train_share))
    train, test = samples[:n_train], samples[n_train:]
    model, why = ClassModel.fit(train, cfg)
    if model is None:
        raise ValueError(why)
    rows = []
    for i, s in enumerate(test):
        before = samples[: n_train + i]
        exact, h = exact_match_class(before, s.ident, cfg, diag)
        p = model.predict(s.ident)
        rows.append(
            {
                "job_id": s.job_id,
                "name": s.ident.name,
                "exe": executable(s.ident.command),
                "ranks": s.ident.ranks,
                "true": s.label,
                "exact": exact,
                "has_history": h is not None,
                "model": p.klass,
                "model_raw": p.predicted,
                "confidence": p.confidence,
                "exact+model": exact if h is not None else p.klass,
                "true_bw": s.metrics.numbers["bandwidth_b_s"],
                "model_bw": p.history.bandwidth_b_s,
                "exact_bw": h.bandwidth_b_s if h is not None else None,
            }
        )
    policies = {}
    for pol in ("exact", "model", "exact+model"):
        y = [r["true"] for r in rows]
        yp = [r[pol] for r in rows]
        uns = [r for r in rows if not r["has_history"]]
        policies[pol] = {
            "accuracy": sum(a == b for a, b in zip(y, yp, strict=True)) / len(rows) if rows else float("nan"),
            "accuracy_unseen": (sum(r["true"] == r[pol] for r in uns) / len(uns)) if uns else float("nan"),
            "confusion": confusion_matrix(y, yp, labels=list(CLASSES)).tolist() if rows else [],
        }

    def med_err(key: str) -> float:
        errs = [abs(math.log10(max(r[key], 1.0) / max(r["true_bw"], 1.0))) for r in rows if r[key] is not None]
        return float(np.median(errs)) if errs else float("nan")

    return Evaluation(
        train=len(train),
        test=len(test),
        unseen=sum(not r["has_history"] for r in rows),
        split_ns=test[0].start_ns if test else 0,
        policies=policies,
        rows=rows,
        fallbacks=sum(r["model"] != r["model_raw"] for r in rows),
        bandwidth_log_error={"model": med_err("model_bw"), "exact": med_err("exact_bw")},
    )
