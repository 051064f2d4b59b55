"""The PodMigrationJob controller: arbitration, the job state machine, Reservations."""
