"""Everything edgevit does with LiteRT files, in one place: the flatbuffer
reader, the interpreter loader, the embedded metadata and the GPU / NNAPI
delegate rules. Used by export/ and profile/; imports neither."""
