"""The acceptance report's shape, shared by the suite and the login side (no torch here).

Report (JSON object, ``schema`` == SCHEMA, ``schema_version`` == SCHEMA_VERSION):
    node, hostname, started, finished (unix time), duration_s, device ("cuda" | "cpu" |
    "sim": a simulated node's GPUs, ``simulated``), simulated (bool: figures made, not
    measured), quick (bool), prolog (bool: ``--prolog``, NVML alone, no load), options (the
    suite's settings), verdict ("PASS" | "FAIL"),
    failures (list of one-line strings), warnings (one-line strings of WARN results: noted,
    not failed, e.g. a GPU model without a reference peak, with its measured figure),
    sections: one object per name in SECTIONS, each with
    ``verdict`` (one of VERDICTS), ``summary`` (one line) and its figures:
      env:           hostname, python, torch, cuda, driver, nccl, gpu_count, expected_gpus,
                     gpus [{index, name, uuid, model_key, memory_bytes, vbios}],
                     nvidia_smi_l [str]
      shape:         gpus [{index, label, name, pci, link_gen, link_width, max_link_gen,
                     max_link_width, read_under_load, nvlinks, nvlinks_active, ecc_mode,
                     ecc_pending, persistence, mig, mig_pending, verdict, reason}],
                     expect_model, expect_nvlinks, expect_mig
      compute:       devices [{index, name, model_key, results [{dtype, n, iters, seconds,
                     tflops, peak_tflops, fraction, floor, floor_source, check, verdict,
                     reason}]}], floor (one for all, or null), floors (per model key and
                     dtype), same_model_tolerance, warnings
      membw:         devices [{index, name, bytes, gbps, peak_gbps, fraction, verdict, reason}]
      memtest:       devices [{index, label, name, bytes, patterns, gbps, wrong_words,
                     first_bad {pattern, offset, address, expected, read} | null, verdict,
                     reason}]
      pcie:          devices [{index, h2d_gbps, d2h_gbps, link_gen, link_width, peak_gbps,
                     fraction, verdict, reason}]
      p2p:           bytes, iters, median_gbps, floor, devices [labels], pairs [{src, dst,
                     gbps (best of 3 runs), peer_access, data_ok, fraction (of the median
                     pair), verdict, reason}]
      train:         devices [{index, steps, first_loss, final_loss, drop, verdict, reason}]
      burn:          burn_seconds, interval_s, warmup_s, node_sm_clock_median,
                     sm_clock_allowed_mhz, devices [{label, verdict (the burner's OK/FAULTY/
                     DIED), reason, tflops_mean, errors, iterations, elapsed, tflops [per
                     progress line]}], trace {t [s since start], gpus [{index, label, name,
                     power_w [..], sm_clock_mhz [..], temp_c [..], throttle [bit mask ..],
                     throttle_seconds {reason: s}, sm_clock_median, power_max_w, temp_max_c,
                     verdict, reason}]} (one array element per second, null where unreadable)
      ddp_allreduce: world_size, nnodes, backend, numel, bytes, iters, algbw_gbps, busbw_gbps,
                     ranks [{rank, host, ok, mismatches, first_bad}], topology ("8x2": GPUs
                     per node x nodes), sweep {all_reduce: [rows], all_gather: [rows]} with
                     rows {size (bytes), count, type, redop, iters, time_us, algbw, busbw,
                     wrong} as nccl-tests prints them, sweep_busbw_gbps (all-reduce at the
                     largest size), busbw_floor_gbps (this topology's, or null)
      ddp_train:     world_size, steps, ranks [{rank, host, first_loss, final_loss, drop, ok,
                     compute_ms (its forward pass a step, median)}], params_identical,
                     stragglers [one line per rank far slower than the others]
      health:        gpus [{index, ecc_uncorrected_volatile, ecc_uncorrected_aggregate,
                     remapped_rows {correctable, uncorrectable, pending, failure}, xids [int],
                     throttle [names seen during COMPUTE, or now with --prolog],
                     retired_pending, pci,
                     kernel_xids [{xid, hardware, text}], aer {device {correctable, nonfatal,
                     fatal}, port {...}, port_address}, link_errors {replay, recovery,
                     crc_flit, crc_data, pcie_replay: how much each grew during the run;
                     absent with --prolog}, verdict, reason}],
                     kernel_log (source read, or null), kernel_log_error (why unreadable),
                     node_xids (XIDs of PCI devices that are not GPUs under test)

A field that could not be measured is null. Verdicts: PASS, WARN (noted, does not fail),
FAIL, SKIP (not run, with the reason in ``summary``).
"""

SCHEMA = "gpuctl.accept.report"
SCHEMA_VERSION = 1
SECTIONS = (
    "env",
    "shape",
    "compute",
    "membw",
    "memtest",
    "pcie",
    "p2p",
    "train",
    "burn",
    "ddp_allreduce",
    "ddp_train",
    "health",
)
MARKERS = {
    "env": "ENV",
    "shape": "SHAPE",
    "compute": "COMPUTE",
    "membw": "MEMBW",
    "memtest": "MEMTEST",
    "pcie": "PCIE",
    "p2p": "P2P",
    "train": "TRAIN",
    "burn": "BURN",
    "ddp_allreduce": "DDP",
    "ddp_train": "DDP",
    "health": "HEALTH",
}
VERDICTS = ("PASS", "WARN", "FAIL", "SKIP")
RESULT_SUCCESS = "[RESULT] SUCCESS"
RESULT_FAILURE = "[RESULT] FAILURE"
