"""The acceptance report's shape, shared by the suite and the login side (no torch here).

Report (JSON object, ``schema`` == SCHEMA, ``schema_version`` == SCHEMA_VERSION):
    node, hostname, started, finished (unix time), duration_s, device ("cuda" | "cpu"),
    quick (bool), options (the suite's settings), verdict ("PASS" | "FAIL"),
    failures (list of one-line strings), sections: one object per name in SECTIONS, each with
    ``verdict`` (one of VERDICTS), ``summary`` (one line) and its figures:
      env:           hostname, python, torch, cuda, driver, nccl, gpu_count, expected_gpus,
                     gpus [{index, name, uuid, model_key, memory_bytes}], nvidia_smi_l [str]
      compute:       devices [{index, name, model_key, results [{dtype, n, iters, seconds,
                     tflops, peak_tflops, fraction, check, verdict, reason}]}], floor,
                     same_model_tolerance
      membw:         devices [{index, name, bytes, gbps, peak_gbps, fraction, verdict, reason}]
      memtest:       devices [{index, label, name, bytes, patterns, gbps, wrong_words,
                     first_bad {pattern, offset, address, expected, read} | null, verdict,
                     reason}]
      pcie:          devices [{index, h2d_gbps, d2h_gbps, link_gen, link_width, peak_gbps,
                     fraction, verdict, reason}]
      train:         devices [{index, steps, first_loss, final_loss, drop, verdict, reason}]
      ddp_allreduce: world_size, nnodes, backend, numel, bytes, iters, algbw_gbps, busbw_gbps,
                     ranks [{rank, host, ok, mismatches, first_bad}]
      ddp_train:     world_size, steps, ranks [{rank, first_loss, final_loss, drop, ok}],
                     params_identical
      health:        gpus [{index, ecc_uncorrected_volatile, ecc_uncorrected_aggregate,
                     remapped_rows {correctable, uncorrectable, pending, failure}, xids [int],
                     throttle [names seen during COMPUTE], verdict, reason}]

A field that could not be measured is null. Verdicts: PASS, WARN (noted, does not fail),
FAIL, SKIP (not run, with the reason in ``summary``).
"""

SCHEMA = "gpuctl.accept.report"
SCHEMA_VERSION = 1
SECTIONS = (
    "env",
    "compute",
    "membw",
    "memtest",
    "pcie",
    "train",
    "ddp_allreduce",
    "ddp_train",
    "health",
)
MARKERS = {
    "env": "ENV",
    "compute": "COMPUTE",
    "membw": "MEMBW",
    "memtest": "MEMTEST",
    "pcie": "PCIE",
    "train": "TRAIN",
    "ddp_allreduce": "DDP",
    "ddp_train": "DDP",
    "health": "HEALTH",
}
VERDICTS = ("PASS", "WARN", "FAIL", "SKIP")
RESULT_SUCCESS = "[RESULT] SUCCESS"
RESULT_FAILURE = "[RESULT] FAILURE"
