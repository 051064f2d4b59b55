"""The PodMigrationJob controller: admission, the job state machine, Reservations."""
