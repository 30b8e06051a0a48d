# decodelab: config -> models -> raw runs -> tidy tables -> statistics -> figures -> paper PDF.
from snakemake.utils import min_version, validate

min_version("9.5")


# A --configfile replaces the embedded default instead of merging into it: Snakemake merges
# nested mappings, which would add the default's models and pairs to another profile's.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"



validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/sweeps.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/speculative.smk"
include: "workflow/rules/verification.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/paper.smk"
include: "workflow/rules/artifact.smk"


rule all:
    default_target: True
    input:
        "results/paper/paper.pdf",
        expand(f"results/{HOST}/figures/{{fig}}.pdf", fig=PAPER_FIGURES),
