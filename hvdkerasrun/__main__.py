import sys

from hvdkerasrun import main

sys.exit(main())
