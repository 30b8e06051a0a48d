# The quantized backend (llama.cpp through llama-cpp-python, decodelab.studies.quantized.run): a GGUF per
# model x type, the verify cost of each type on each device, and the quantized pairs' GGUF
# inputs. The GGUF files live in results/gguf/<model>/, beside prepare_model's directory
# output, which may not contain another rule's output.
rule gguf:
    input:
        model="results/models/{model}",
        f16=lambda wc: [] if wc.quant == "F16" else gguf_file(wc.model, "F16"),
    output:
        "results/gguf/{model}/{quant}.gguf",
    log:
        "logs/gguf/{model}/{quant}.log",
    wildcard_constraints:
        quant="|".join(QUANT_TYPES),
    conda:
        job_conda_env
    container:
        job_container
    shell:
        "decodelab convert-gguf --model-dir {input.model} --type {wildcards.quant}"
        " --out-dir $(dirname {output}) 2> {log}"


rule verify_cost:
    input:
        lambda wc: gguf_file(wc.model, wc.quant),
    output:
        "results/{host}/llama.cpp-{quant}-{device}/parallelism/{model}/rep{repeat}.parquet",
    log:
        "logs/{host}/llama.cpp-{quant}-{device}/parallelism/{model}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/llama.cpp-{quant}-{device}/parallelism/{model}/rep{repeat}.tsv"
    wildcard_constraints:
        quant="|".join(QUANT_TYPES),
        device="cpu|cuda",
        repeat=r"\d+",
    conda:
        job_conda_env
    container:
        job_container
    threads: lambda wc: workflow.cores if wc.device == "cpu" else 1
    resources:
        bench_cpu=lambda wc: int(wc.device == "cpu"),
        gpu=lambda wc: int(wc.device == "cuda"),
    params:
        spec=lambda wc: as_arg(SPEC.parallelism_spec(wc.quant)),
    shell:
        "decodelab verify-cost --gguf {input} --model {wildcards.model}"
        " --device {wildcards.device} --spec {params.spec} --repeat {wildcards.repeat}"
        " --threads {threads} --out {output} 2> {log}"


rule llama_peer:
    input:
        target=pair_gguf("target"),
        draft=pair_gguf("draft"),
        target_dir=lambda wc: f"results/models/{PAIRS[wc.pair].target}",
    output:
        "results/{host}/llama.cpp-peer/{pair}/rep{repeat}.parquet",
    log:
        "logs/{host}/llama.cpp-peer/{pair}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/llama.cpp-peer/{pair}/rep{repeat}.tsv"
    wildcard_constraints:
        repeat=r"\d+",
    conda:
        job_conda_env
    container:
        job_container
    threads: lambda wc: workflow.cores if PAIRS[wc.pair].target_device == "cpu" else 1
    resources:
        bench_cpu=lambda wc: int(PAIRS[wc.pair].target_device == "cpu"),
        gpu=lambda wc: int(PAIRS[wc.pair].target_device == "cuda"),
    params:
        spec=as_arg(SPEC.job_spec()),
        device=lambda wc: PAIRS[wc.pair].target_device,
    shell:
        "decodelab llama-peer --pair {wildcards.pair} --target-gguf {input.target}"
        " --draft-gguf {input.draft} --target-dir {input.target_dir}"
        " --device {params.device} --spec {params.spec} --repeat {wildcards.repeat}"
        " --threads {threads} --out {output} 2> {log}"


rule quantized_stats:
    input:
        speedup="results/{host}/stats/speculative_speedup.csv",
        acceptance="results/{host}/stats/speculative_acceptance.csv",
        verify_cost=verify_cost_runs,
        verdicts=verdict_tables("parallelism"),
        runs=quantized_pair_runs,
        peer=peer_runs,
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("quantized")),
    log:
        "logs/{host}/quantized_stats.log",
    conda:
        job_conda_env
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.stats.job_spec()),
        out=lambda wc, output: os.path.dirname(output[0]),
        stats=lambda wc, input: os.path.dirname(input.speedup),
    shell:
        "decodelab quantized-stats --spec {params.spec} --stats {params.stats}"
        " --verdicts {input.verdicts}"
        " --out {params.out} --verify-cost {input.verify_cost} --runs {input.runs}"
        " --peer {input.peer} 2> {log}"
