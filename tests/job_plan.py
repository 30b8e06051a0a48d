"""Print every job of a forced full plan as JSON: rule, wildcards, image and conda environment.

`python tests/job_plan.py WORKDIR [--configfile F] [--config K=V ...] [--sdm apptainer]`. It builds
the DAG through Snakemake's API, as `snakemake -n --forceall` does, but reads each job's image
and environment, which a dry run does not print; no apptainer or conda is needed for that.
"""

import argparse
import json
import sys
from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.cli import parse_config
from snakemake.settings.types import (
    ConfigSettings,
    DeploymentMethod,
    DeploymentSettings,
    OutputSettings,
    ResourceSettings,
)


def plan(workdir: Path, configfiles: list[Path], config: list[str], sdm: list[str]) -> list[dict]:
    overwrite = parse_config(config) if config else {}
    methods = frozenset(DeploymentMethod.parse_choice(m) for m in sdm)
    with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(configfiles=configfiles, config=overwrite),
            deployment_settings=DeploymentSettings(deployment_method=methods),
            snakefile=workdir / "Snakefile",
            workdir=workdir,
        )
        workflow = workflow_api.dag().workflow_api._workflow
        workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True,
                              nolock=True)
        workflow._build_dag()
        return [
            {
                "rule": job.rule.name,
                "wildcards": dict(job.wildcards_dict),
                "container": job.container_img_url,
                # the image it would really run in: none unless --sdm apptainer
                "runs_in": job.container_img_url if job.container_img else None,
                "conda": Path(str(job.conda_env_spec.file)).name if job.conda_env_spec else None,
                # `localrules`: on a cluster it runs where snakemake runs, not as a cluster job
                "local_rule": job.rule.name in workflow._localrules,
            }
            for job in workflow.dag.jobs
        ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--configfile", type=Path, action="append", default=[])
    parser.add_argument("--config", nargs="*", default=[])
    parser.add_argument("--sdm", action="append", default=[])
    args = parser.parse_args()
    json.dump(plan(args.workdir.resolve(), args.configfile, args.config, args.sdm), sys.stdout)


if __name__ == "__main__":
    main()
