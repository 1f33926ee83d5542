"""Scan readers (Eiger-style NeXus/HDF5, CXI) into one scan model; the product file.

Nothing here imports the rest of beamflow.
"""

from .cxi import read_cxi, write_cxi
from .eiger import read_detector_scan, scan_progress, scan_progress_detail
from .errors import ScanFormatError
from .load import find_scan_file, load_scan
from .product import Product, read_product, write_product
from .scan import Geometry, Scan, ZonePlateOptics, invalid_counts

__all__ = [
    "Geometry",
    "Product",
    "Scan",
    "ScanFormatError",
    "find_scan_file",
    "invalid_counts",
    "load_scan",
    "read_cxi",
    "read_detector_scan",
    "read_product",
    "scan_progress",
    "scan_progress_detail",
    "write_cxi",
    "write_product",
    "ZonePlateOptics",
]
