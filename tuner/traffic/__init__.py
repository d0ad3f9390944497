"""Recorded traffic: the table every later stage replays, and the tools that make and inspect it.

io         read_traffic / write_traffic / validate_traffic, shape_columns, check_output / check_writable
           (an output path checked before the work that fills it), is_generative (prompt_tokens and
           output_tokens: requests to a generative model; PROMPT_TOKENS, OUTPUT_TOKENS, PREFIX_ID),
           fit_context (the generative requests that fit a model's context)
windows    due_offsets, scale_time, window, busiest_window, step_window, fits_one_step, mean_rps,
           mean_output_tps, peak_rps
           (time from the first request)
synth      synth_poisson / synth_diurnal / synth_bursty / synth_flash_crowd, SizeSpec
importers  import_triton_trace, import_azure, import_csv
stats      describe, format_stats, plot_stats, check_plot_path
recording  open_recording: Parquet files (one, a directory, a glob; a CSV converted once) as one
           recording read a row group at a time (import tuner.traffic.recording)
scan       describe_recording, busiest_in, read_window, read_since, read_range, read_all: statistics and windows
           of a recording without holding it (import tuner.traffic.scan)
"""

from tuner.traffic.importers import import_azure, import_csv, import_triton_trace
from tuner.traffic.io import (
    BATCH_SIZE,
    MODEL,
    OUTPUT_TOKENS,
    PREFIX_ID,
    PROMPT_TOKENS,
    SEQ_LEN,
    TIMESTAMP,
    check_output,
    check_writable,
    fit_context,
    is_generative,
    read_traffic,
    shape_columns,
    validate_traffic,
    write_traffic,
)
from tuner.traffic.stats import check_plot_path, describe, format_stats, plot_stats
from tuner.traffic.synth import SizeSpec, synth_bursty, synth_diurnal, synth_flash_crowd, synth_poisson
from tuner.traffic.windows import (
    busiest_window,
    due_offsets,
    fits_one_step,
    mean_output_tps,
    mean_rps,
    parse_duration,
    peak_rps,
    scale_time,
    step_window,
    window,
)

__all__ = [
    "BATCH_SIZE",
    "MODEL",
    "OUTPUT_TOKENS",
    "PREFIX_ID",
    "PROMPT_TOKENS",
    "SEQ_LEN",
    "TIMESTAMP",
    "SizeSpec",
    "busiest_window",
    "check_output",
    "check_plot_path",
    "check_writable",
    "describe",
    "due_offsets",
    "fit_context",
    "fits_one_step",
    "format_stats",
    "import_azure",
    "import_csv",
    "import_triton_trace",
    "is_generative",
    "mean_output_tps",
    "mean_rps",
    "parse_duration",
    "peak_rps",
    "plot_stats",
    "read_traffic",
    "scale_time",
    "shape_columns",
    "step_window",
    "synth_bursty",
    "synth_diurnal",
    "synth_flash_crowd",
    "synth_poisson",
    "validate_traffic",
    "window",
    "write_traffic",
]
