"""How fast a .tflite file runs, where, and why: behind `edgevit bench`.

- ``bench``: one or more files x (this machine, phones) x delegates x
  threads, collected into one result document.
- ``host``: latency on this machine with the LiteRT interpreter, each
  configuration in a child process.
- ``adb``: phones over `adb`: discovery, device facts, `benchmark_model` runs.
- ``benchmark_binary``: the official `benchmark_model` tool: its command
  lines, which machine a build runs on, running it here.
- ``benchmark_output``: reading what `benchmark_model` prints.
- ``arm``: exact instruction counts on LiteRT's Arm64 kernels (emulated),
  by function and kernel family; ``symbols`` names the code addresses and
  ``kernels`` sorts functions into kernel families.
- ``report``: the console tables, CSV files and plots of `bench` and `check`.
"""
