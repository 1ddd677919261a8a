from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_redisqueue", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxJob",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.CharField(max_length=64, unique=True)),
                ("backend", models.CharField(max_length=64)),
                ("queue", models.CharField(max_length=64)),
                ("priority", models.IntegerField(default=0)),
                ("payload", models.TextField()),
                ("due_ms", models.BigIntegerField(default=0)),
                ("after", models.CharField(blank=True, default="", max_length=64)),
                ("options", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "outbox job",
                "default_permissions": (),
            },
        ),
    ]
