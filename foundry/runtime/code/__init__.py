"""The code a graph runs: which module image holds each kernel at SAVE (``images``),
binding archived kernels to live functions at LOAD (``binding``), and the images'
device globals, recorded at SAVE and checked or restored at LOAD (``module_globals``)."""
