# scripts/quantized_cuda.sh 570: its commands in order, with their wall time (cwd: /tmp/quantized-cuda)
decodelab prepare-model --spec {"source": "train", "n_layer": 6, "n_embd": 128, "n_head": 4, "n_positions": 256, "vocab_size": 4096, "corpus_mb": 8, "seq_len": 256, "batch_size": 4, "steps": 1500, "lr": 0.005, "seed": 1, "device": "cuda"} --out results/models/target  # 41 s
decodelab prepare-model --spec {"source": "train", "n_layer": 1, "n_embd": 128, "n_head": 2, "n_positions": 256, "vocab_size": 4096, "corpus_mb": 8, "seq_len": 256, "batch_size": 4, "steps": 900, "lr": 0.003, "seed": 2, "teacher": "target", "distill": 1.0, "device": "cuda"} --teacher-dir results/models/target --out results/models/draft  # 21 s
decodelab prepare-model --out results/models/gpt2 --spec {"source": "init", "preset": "gpt2", "seed": 1}  # 14 s
decodelab convert-gguf --model-dir results/models/target --type F16 --out-dir results/gguf/target  # 11 s
decodelab convert-gguf --model-dir results/models/target --type Q8_0 --out-dir results/gguf/target  # 1 s
decodelab convert-gguf --model-dir results/models/target --type Q4_0 --out-dir results/gguf/target  # 1 s
decodelab convert-gguf --model-dir results/models/draft --type F16 --out-dir results/gguf/draft  # 12 s
decodelab convert-gguf --model-dir results/models/draft --type Q8_0 --out-dir results/gguf/draft  # 1 s
decodelab convert-gguf --model-dir results/models/draft --type Q4_0 --out-dir results/gguf/draft  # 1 s
decodelab convert-gguf --model-dir results/models/gpt2 --type F16 --out-dir results/gguf/gpt2  # 15 s
decodelab convert-gguf --model-dir results/models/gpt2 --type Q8_0 --out-dir results/gguf/gpt2  # 1 s
decodelab convert-gguf --model-dir results/models/gpt2 --type Q4_0 --out-dir results/gguf/gpt2  # 2 s
decodelab llama-peer --pair q4-q8-cuda --target-gguf results/gguf/target/Q4_0.gguf --draft-gguf results/gguf/draft/Q8_0.gguf --target-dir results/models/target --device cuda --spec {"budget": 64, "hf_assisted": false, "ks": [1, 2, 4, 8], "modes": ["greedy", "sampled"], "prompt_len": 32, "prompts": 4, "seed": 20261130, "temperature": 1.0, "top_k": 0, "top_p": 1.0} --repeat 0 --out results/reference/cuda-h200/quantized/raw/llama.cpp-peer/q4-q8-cuda/rep0.parquet  # 30 s
decodelab llama-peer --pair q4-q8-cuda --target-gguf results/gguf/target/Q4_0.gguf --draft-gguf results/gguf/draft/Q8_0.gguf --target-dir results/models/target --device cuda --spec {"budget": 64, "hf_assisted": false, "ks": [1, 2, 4, 8], "modes": ["greedy", "sampled"], "prompt_len": 32, "prompts": 4, "seed": 20261130, "temperature": 1.0, "top_k": 0, "top_p": 1.0} --repeat 1 --out results/reference/cuda-h200/quantized/raw/llama.cpp-peer/q4-q8-cuda/rep1.parquet  # 30 s
decodelab verdicts --study speculative --spec {} --out results/reference/cuda-h200/quantized/stats/verdicts_speculative.csv  # 2 s
decodelab verdicts --study parallelism --spec {} --out results/reference/cuda-h200/quantized/stats/verdicts_parallelism.csv  # 1 s
