# The tables and figures the paper reads. merge_hosts writes the tables of this host and of
# every imported one (config 'hosts') to results/combined/stats/; the figure rules draw
# results/combined/figures/ from them. The tables are decodelab.core.tables'.
PAPER_FIGURES = studies.figures()  # every study's, from its folder (decodelab.studies)


rule settings:
    output:
        f"results/{HOST}/settings.json",
    log:
        f"logs/{HOST}/settings.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.paper_settings(HOST)),
    shell:
        "decodelab settings --spec {params.spec} --out {output} 2> {log}"


rule paper:
    input:
        sources=sorted(str(p) for p in Path("paper").rglob("*") if p.is_file()),
        study_sections=[str(p) for p in studies.files("section.tex")],
        settings=rules.settings.output,
        stats=expand("results/combined/stats/{table}.csv", table=tables.names()),
        figures=expand("results/combined/figures/{fig}.pdf", fig=PAPER_FIGURES),
    output:
        report("results/paper/paper.pdf", category="Paper", caption="../report/paper.rst"),
    log:
        "logs/paper.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        None  # latexmk is on the host (`make tex`); the images carry no TeX
    params:
        stats=lambda wc, input: os.path.dirname(input.stats[0]),
        figures=lambda wc, input: os.path.dirname(input.figures[0]),
    shell:
        "decodelab paper --sources paper --stats {params.stats} --figures {params.figures}"
        " --settings {input.settings} --build-dir results/paper/build --out {output} > {log} 2>&1"
