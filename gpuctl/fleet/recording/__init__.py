"""Record the fleet's stream to a file and replay it: ``gpuctl record``, ``R`` in the screen,
``gpuctl replay`` and ``gpuctl replay --export-csv``.

- ``format``: the file's layout (header, frames, index, trailer), its tags and the records'
  shapes (``slurm_jobs``/``read_slurm_jobs``: a ``slurm`` record written and read back).
- ``writer``: ``RecordingWriter`` (frames, index, trailer) and ``Recorder`` (a fleet's stream,
  keyframes at each frame's start), ``new_recording_path``.
- ``reader``: ``RecordingReader``: a file from outside, checked before it is believed.
- ``replayer``: ``Replayer``: a recording played into a fleet of ``RecordedLink`` nodes on a
  clock of recorded time.
- ``times``: ``--from`` positions and the recorded time as shown.
- ``csvexport``: ``export_csv``, one row per node x GPU x sample.
"""
