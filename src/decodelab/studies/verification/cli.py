"""The equivalence verification's `decodelab` verbs: its measuring jobs (`verify`, `verify-long`),
its reports as tables, and its figures. Torch is imported inside the verbs, as the CLI's own do."""

from __future__ import annotations

import json
from pathlib import Path

from decodelab.backends.jobs import add_gguf, open_job
from decodelab.core.verbs import add_figures_verb, typed


def verify_rule(report: str) -> str:
    """The rule that writes a report: verification/{exact,monte_carlo,real_<pair>,
    long_<backend>}.json."""
    stem = Path(report).stem
    for prefix in ("real", "long"):
        if stem.startswith(f"{prefix}_"):
            return f"verify_{prefix}"
    return f"verify_{stem}"


REPORT_KEYS = {"levels": "results"}  # a verification table -> its rows' key in the reports


def verification_stats(args):
    import pandas as pd

    from decodelab.core import tables
    from decodelab.core.io import read_report

    reports = [read_report(p, verify_rule(p)) for p in args.reports]
    frames = {}
    for key in (t.key for t in tables.group("verification")):
        rows = [r for report in reports for r in report.get(REPORT_KEYS.get(key, key), [])]
        frames[key] = pd.DataFrame(rows).drop(columns=["detail"], errors="ignore")
    tables.write_group(args.out, "verification", frames)



def verify(args):
    from decodelab.backends.devices import set_sdp_backends
    from decodelab.config.settings import Pair, Verification
    from decodelab.core.io import write_report
    from decodelab.studies.verification import run as vf

    pair = typed(Pair, args.pair_spec) if args.level == "real" else None
    spec = open_job(args, *(pair.devices if pair else ()), settings=Verification)
    if args.level == "exact":
        out = vf.run_exact(spec, args.target_dir, args.draft_dir, spec.seed)
    elif args.level == "monte-carlo":
        out = vf.run_monte_carlo(spec)
    else:
        gguf = {role: path for role, path in (("target", args.target_gguf),
                                              ("draft", args.draft_gguf)) if path}
        set_sdp_backends(json.loads(args.sdp_backends) if args.sdp_backends else None,
                         "speculative.sdp_backends")
        out = vf.run_real(spec, args.pair, pair, args.target_dir, args.draft_dir, spec.seed,
                          gguf)
    write_report(out, args.out)


def verify_long(args):
    from decodelab.config.settings import LongVerificationJob, Verification
    from decodelab.core.io import write_report
    from decodelab.studies.verification import run as vf

    job = typed(LongVerificationJob, args.long_spec)
    spec = open_job(args, job.device, settings=Verification)
    write_report(vf.run_long(spec, job, args.target_dir, args.draft_dir), args.out)


def add_verbs(verbs) -> None:
    p = verbs.add_parser("verify-stats", help="flatten the verification reports into tables")
    p.add_argument("--out", required=True, help="the stats directory")
    p.add_argument("reports", nargs="+")
    p.set_defaults(func=verification_stats)

    add_figures_verb(verbs, "verify-figures", "the verification figures",
                     "decodelab.studies.verification.figures:verification_figures")

    p = verbs.add_parser("verify", help="one level of the equivalence verification, as JSON")
    p.add_argument("--level", required=True, choices=["exact", "monte-carlo", "real"])
    p.add_argument("--spec", required=True, help="the verification settings, as JSON")
    p.add_argument("--target-dir")
    p.add_argument("--draft-dir")
    p.add_argument("--pair", help="the configuration's name (level real)")
    p.add_argument("--pair-spec", help="devices and dtype, as JSON (level real)")
    p.add_argument("--sdp-backends", help="the attention backends allowed, as a JSON list "
                   "(level real; default: torch's)")
    add_gguf(p)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=verify)
    p = verbs.add_parser("verify-long", help="every verification level on the long-context "
                         "pair (config long.verification), as JSON")
    p.add_argument("--spec", required=True, help="config verification, as JSON")
    p.add_argument("--long-spec", required=True, help="config long.verification's job, as JSON")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--draft-dir", help="the drafter's model directory (none: self)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=verify_long)
