# Artifact evaluation: this run against committed reference runs, the benchmark summary, and the
# merge of every host's tables (this one and those in config 'hosts') for the paper and report.


rule reference_comparison:
    input:
        stats=expand(
            "results/{{host}}/stats/{table}.csv",
            table=[
                "environment",
                "latency",
                "kv_speedup",
                "speculative_speedup",
                "speculative_acceptance",
                "verification_levels",
                "selection",
                "long_speedup",
                "long_acceptance",
            ],
        ),
        references=reference_tables,
    output:
        "results/{host}/stats/reference_comparison.csv",
    log:
        "logs/{host}/reference_comparison.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input.stats[0]),
    shell:
        "decodelab compare-reference --stats {params.stats} --references results/reference"
        " --out {output} 2> {log}"


rule benchmark_summary:
    input:
        measured_outputs,
    output:
        "results/{host}/stats/benchmarks.csv",
    log:
        "logs/{host}/benchmark_summary.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        files=lambda wc: " ".join(benchmark_files(wc)),
    shell:
        "decodelab benchmarks --out {output} {params.files} 2> {log}"


rule merge_hosts:
    input:
        local=expand(f"results/{HOST}/stats/{{table}}.csv", table=tables.local_tables()),
        imported=imported_tables,
    output:
        [
            report(
                f"results/combined/stats/{table}.csv",
                category=tables.report_category(table),
                subcategory="tables",
                caption="../report/table.rst",
            )
            for table in tables.names()
        ],
    log:
        "logs/merge_hosts.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        local=HOST,
        hosts=" ".join(f"{h}=results/{h}" for h in [HOST, *IMPORTED]),
        tables=" ".join(tables.names()),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab merge-hosts --local {params.local} --out {params.out} --tables {params.tables}"
        " --hosts {params.hosts} 2> {log}"
