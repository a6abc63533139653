"""Model families. Importing this package registers every variant."""
