"""Ground floor: settings, logging, metrics and the names shared across processes. Imports nothing of Tocsin."""
