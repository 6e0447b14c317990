"""Every on-disk format dsdprof writes or reads, with its version: the one home of version strings.

Bump a version here when a format changes what its fields mean; list the versions still read
beside it. Formats: measurement rows (Parquet), the K table (JSON), the run manifest
(``_sweep.json``), a fleet's index and run records, hardware profiles (TOML), and the analytic
engine's step model (its version is part of a sim run's identity).
"""

MEASUREMENT_SCHEMA_VERSION = "dsdprof.measurements/v7"
# Every measurement version this dsdprof reads (v2 added columns, v1 files lack them; v3 counts
# acceptance_length untrimmed, drops the identity goodput_check and adds the cross-check columns
# vllm_drafted_per_draft, trace_output_tokens, checks_failed -- v1/v2 files lack them; v4 adds
# design, paired rows whose waves are shared by every K of a batch size -- v1-v3 rows are cells; v5 adds
# sample_block, the wave block of each paired sample, vanilla rows' waves interleaved with their group's --
# v1-v4 files lack it and their vanilla rows pair with nothing; v6: a paired DSD row's acceptance_length
# (and its samples, acceptance_per_pos) pools every step of its group per draft position, the K's own
# steps' value moves to the new column acceptance_length_own -- v1-v5 files lack it; v7: a paired DSD row's
# acceptance_length is a server held at K replayed over every request's match sequence
# (measure/vllm/replay.py), acceptance_per_pos the replayed AL(i) - AL(i - 1); paired step times only from
# settled pure steps (hold 4) and, under the synchronous scheduler, without the profiling scheduler's own
# time -- same columns as v6).
# A file of a context sweep ([sweep] context_lens) carries one more column, ``context_len``
# (:data:`dsdprof.formats.measurements.CONTEXT_COLUMN`); files without it are at the spec's input_len.
READABLE_MEASUREMENT_VERSIONS = ("dsdprof.measurements/v1", "dsdprof.measurements/v2",
                                 "dsdprof.measurements/v3", "dsdprof.measurements/v4",
                                 "dsdprof.measurements/v5", "dsdprof.measurements/v6",
                                 "dsdprof.measurements/v7")
PARQUET_METADATA_KEY = b"dsdprof"  # Parquet key-value metadata: version + the run's provenance

TABLE_SCHEMA_V1 = "dsdprof.ktable/v1"
TABLE_SCHEMA_V2 = "dsdprof.ktable/v2"
TABLE_SCHEMA_V3 = "dsdprof.ktable/v3"  # v2 + ``contexts``: a K table per context bucket (a context sweep)
TABLE_SCHEMA = TABLE_SCHEMA_V2  # the K-table version dsdprof writes without a context axis (v1 still loads)
TABLE_SCHEMAS = (TABLE_SCHEMA_V1, TABLE_SCHEMA_V2, TABLE_SCHEMA_V3)

MANIFEST_VERSION = "dsdprof.run/v1"  # a run directory's _sweep.json
READABLE_MANIFEST_VERSIONS = (MANIFEST_VERSION,)

FLEET_INDEX_SCHEMA = "dsdprof.fleet-index/v1"
FLEET_RUN_RECORD_SCHEMA = "dsdprof.fleet-run/v1"
HWPROFILE_SCHEMA = "dsdprof.hwprofile/v1"  # probe-hardware / calibrate profiles
SIM_MODEL_VERSION = "sim-step-model/5"  # 2: small-M GEMM tiles, quantization_config storage;
# 3: per-layer / MoE latency terms, per-method speculation overhead, KV-cache dtype, fitted priors,
#    GQA attention tile (measure.sim.context)
# 4: priors refitted with DeepSeek-R1 on SGLang 0.5.7; MLA term only on pre-FlashMLA kernels and H20;
#    FP8 GEMM ratio from DeepGEMM (issue 36)
# 5: H20 decode attention computes its whole FA3 query tile (measure.sim.context.FULL_TILE_GPUS)

# Rollout and serving rows (``dsdprof rollout``; dsdprof/formats/rollouts.py): a Parquet file of their
# own, same metadata key, its own version (measurement readers refuse it by name).
ROLLOUT_SCHEMA_VERSION = "dsdprof.rollouts/v1"
READABLE_ROLLOUT_VERSIONS = (ROLLOUT_SCHEMA_VERSION,)
