"""Coverage-guided fuzz targets (atheris) for the frame decoder, the URL check and the SQL gate."""
