# decodelab: config -> models -> raw runs -> tidy tables -> statistics -> figures -> paper PDF.
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from decodelab import studies
from decodelab.config.check import schema_problem
from decodelab.core.yamlsafe import file_problem

min_version("9.5")
SCHEMA = "workflow/schemas/config.schema.yaml"

# Every config file as plain data of a config's size (decodelab.core.yamlsafe), before the embedded
# one is read below and before the config is walked: Snakemake read the --configfile ones while
# parsing its command line, where the workflow profile's preflight checked them first.
for _file in workflow.overwrite_configfiles or ["config.yaml"]:
    if problem := file_problem(_file):
        raise WorkflowError(problem)

# A --configfile replaces the embedded default instead of merging into it: Snakemake merges
# nested mappings, which would add the default's models and pairs to another profile's.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# One line naming the key and what is allowed (control characters and NaN anywhere included);
# then Snakemake's validate fills in the defaults.
problem = schema_problem(config, Path(workflow.basedir) / SCHEMA)
if problem:
    raise WorkflowError(problem)
validate(config, SCHEMA)


include: "workflow/rules/names.smk"
include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/quantized.smk"
include: "workflow/rules/sweeps.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/speculative.smk"
include: "workflow/rules/verification.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/long.smk"
include: "workflow/rules/batched.smk"
include: "workflow/rules/paper.smk"
include: "workflow/rules/artifact.smk"


# Each study's own rules, from its folder (decodelab.studies)
for study_rules in studies.files("rules.smk"):

    include: study_rules


rule all:
    default_target: True
    input:
        "results/paper/paper.pdf",
        expand(f"results/{HOST}/figures/{{fig}}.pdf", fig=PAPER_FIGURES),


# The last word of every run: whether the measurements were quiet, or which jobs to re-measure
# (decodelab.analysis.stability); nothing where the stability tables are not there (a partial target).
onsuccess:
    from snakemake.logging import logger
    from decodelab.analysis.stability import closing_note

    note = closing_note(Path(f"results/{HOST}/stats"))
    if note:
        logger.warning(note)
