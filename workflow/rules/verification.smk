# Distribution equivalence of speculative sampling: exact closed forms, Monte Carlo, and the
# real model (two samples and greedy agreement) per draft/target configuration the host has.


rule verify_exact:
    input:
        target=f"results/models/{VERIFY_MODELS[0]}",
        draft=f"results/models/{VERIFY_MODELS[1]}",
    output:
        "results/{host}/verification/exact.json",
    log:
        "logs/{host}/verification/exact.log",
    benchmark:
        "benchmarks/{host}/verification/exact.tsv"
    conda:
        job_conda_env
    container:
        job_container
    params:
        spec=as_arg(VERIFY.job_spec()),
    shell:
        "decodelab verify --level exact --spec {params.spec} --target-dir {input.target}"
        " --draft-dir {input.draft} --out {output} 2> {log}"


rule verify_monte_carlo:
    output:
        "results/{host}/verification/monte_carlo.json",
    log:
        "logs/{host}/verification/monte_carlo.log",
    benchmark:
        "benchmarks/{host}/verification/monte_carlo.tsv"
    conda:
        job_conda_env
    container:
        job_container
    params:
        spec=as_arg(VERIFY.job_spec()),
    shell:
        "decodelab verify --level monte-carlo --spec {params.spec} --out {output} 2> {log}"


# Level 3 times nothing, so it does not hold `bench_cpu`; on the CPU its threads become
# processes that draw its samples side by side (decodelab/studies/verification/equivalence.py: in_processes).
rule verify_real:
    input:
        target=lambda wc: f"results/models/{PAIRS[wc.pair].target}",
        draft=lambda wc: f"results/models/{PAIRS[wc.pair].draft}",
        target_gguf=pair_gguf("target"),
        draft_gguf=pair_gguf("draft"),
    output:
        "results/{host}/verification/real_{pair}.json",
    log:
        "logs/{host}/verification/real_{pair}.log",
    benchmark:
        "benchmarks/{host}/verification/real_{pair}.tsv"
    conda:
        job_conda_env
    container:
        job_container
    threads: verify_threads
    resources:
        **DEVICE_RESOURCES,
    params:
        spec=as_arg(VERIFY.job_spec()),
        pair=lambda wc: as_arg(PAIRS[wc.pair].job_spec()),
        gguf=gguf_args,
        sdp=sdp_arg,
    shell:
        "decodelab verify --level real --spec {params.spec} --target-dir {input.target}"
        " --draft-dir {input.draft} --pair {wildcards.pair} --pair-spec {params.pair}"
        " {params.gguf} {params.sdp} --threads {threads} --out {output} 2> {log}"


# The long-context pair (config 'long.verification'): the target verifying on its full cache,
# drafted through a sparse view of a KV cache (its own, or a drafter's of 'long.drafters').
rule verify_long:
    input:
        target=lambda wc: f"results/models/{LONG.target}",
        drafter=lambda wc: long_verification_drafter(),
    output:
        "results/{host}/verification/long_{backend}.json",
    log:
        "logs/{host}/verification/long_{backend}.log",
    benchmark:
        "benchmarks/{host}/verification/long_{backend}.tsv"
    wildcard_constraints:
        backend="cpu|cuda|mps",
    conda:
        job_conda_env
    container:
        job_container
    threads: job_threads
    resources:
        **DEVICE_RESOURCES,
    params:
        spec=as_arg(VERIFY.job_spec()),
        long=lambda wc: as_arg(LONG.verification_spec()),
        drafter=lambda wc, input: f"--draft-dir {input.drafter}" if input.drafter else "",
    shell:
        "decodelab verify-long --spec {params.spec} --long-spec {params.long}"
        " --target-dir {input.target} {params.drafter} --threads {threads} --out {output}"
        " 2> {log}"


rule verification_stats:
    input:
        verification_reports,
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("verification")),
    log:
        "logs/{host}/verification_stats.log",
    conda:
        job_conda_env
    container:
        job_container
    params:
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab verify-stats --out {params.out} {input} 2> {log}"
