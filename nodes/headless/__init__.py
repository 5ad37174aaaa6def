"""Running API-format workflows without ComfyUI (the library behind ``anydevice run``): the runner and the
ComfyUI core nodes it stands in for."""
