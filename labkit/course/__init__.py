"""The course layer: what the notebooks call. Ladders, demos, conclusions computed from a run's
measurements, tables, plots, the capstone, and the runners that execute notebooks (`notebook`,
`runner`). It builds on the engines (`labkit.torch`, `labkit.tf`) and the framework-free core;
nothing below it imports it."""
