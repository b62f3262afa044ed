"""The lab VM: a throwaway microVM with a stock kernel, its Python image, and what decides that a run needs it."""
