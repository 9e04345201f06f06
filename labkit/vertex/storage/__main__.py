import sys

from labkit.vertex.storage.server import main

sys.exit(main())
